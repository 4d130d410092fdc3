"""The data plane's keys: one CURVE key pair each for a topology's inboxes and channels, read from the worker's
environment and never shown."""

from __future__ import annotations

import pytest

from elastream.runtime.security import DataPlaneConfigError, generate_keys, keys_from_env


def test_keys_are_never_shown_and_bad_settings_name_the_variable_not_the_value() -> None:
    keys = generate_keys()
    assert keys.server_secret.decode() not in repr(keys) and keys.client_secret.decode() not in f"{keys}"
    assert keys_from_env({"ELASTREAM_DATA_PLANE_AUTH": "off"}) is None
    again = keys_from_env(keys.env())
    assert again is not None and again.client_public == keys.client_public
    with pytest.raises(DataPlaneConfigError) as missing:
        keys_from_env({})
    assert "ELASTREAM_DATA_PLANE_SERVER_KEY" in str(missing.value)
    broken = {**keys.env(), "ELASTREAM_DATA_PLANE_CLIENT_KEY": keys.env()["ELASTREAM_DATA_PLANE_CLIENT_KEY"][:-1]}
    with pytest.raises(DataPlaneConfigError) as short:
        keys_from_env(broken)
    assert broken["ELASTREAM_DATA_PLANE_CLIENT_KEY"] not in str(short.value)
