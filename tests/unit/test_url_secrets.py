"""Secrets in a Redis URL's query (issue 38): `ssl_password` (the TLS client key's password) and every other secret
query parameter are hidden by `store.registry.redacted` (what messages, logs, events and status show) and left out
of the URL a topology's workers get (`store.acl.topology_url`), as the password is, however the name is cased or
percent-encoded (redis-py decodes it)."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.connection import parse_url

from elastream.store.acl import topology_url
from elastream.store.registry import is_secret_parameter, redacted

USER, PASSWORD = "elastream-t-prod-payments", "0123abcd" * 8
SECRET = "k3y-pa55"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            f"rediss://h:6380/0?ssl_keyfile=/tls/client.key&ssl_password={SECRET}&ssl_certfile=/tls/client.crt",
            "rediss://h:6380/0?ssl_keyfile=/tls/client.key&ssl_password=***&ssl_certfile=/tls/client.crt",
        ),
        (f"rediss://:adm1n@h:6380/0?ssl_password={SECRET}", "rediss://:***@h:6380/0?ssl_password=***"),
        (f"rediss://h/0?SSL_PASSWORD={SECRET}", "rediss://h/0?SSL_PASSWORD=***"),
        # percent-encoded names: redis-py decodes them, so they are the same parameter
        (f"rediss://h/0?ssl%5Fpassword={SECRET}&db=1", "rediss://h/0?ssl%5Fpassword=***&db=1"),
        (f"unix:///run/redis.sock?pass%77ord={SECRET}", "unix:///run/redis.sock?pass%77ord=***"),
        # a # in the value ends what redis-py reads, not what is hidden
        (f"rediss://h/0?ssl_password=ab#{SECRET}&db=1", "rediss://h/0?ssl_password=***&db=1"),
        (f"rediss://h/0?db=1;ssl_password={SECRET}", "rediss://h/0?db=1;ssl_password=***"),
        # the password parameter as before
        (f"unix:///run/redis.sock?db=0&password={SECRET}", "unix:///run/redis.sock?db=0&password=***"),
        (
            "rediss://h/0?ssl_ca_certs=/ca.pem&ssl_cert_reqs=required",
            "rediss://h/0?ssl_ca_certs=/ca.pem&ssl_cert_reqs=required",
        ),
    ],
)
def test_a_secret_query_parameter_is_redacted(url: str, shown: str) -> None:
    assert redacted(url) == shown
    assert SECRET not in redacted(url) and "adm1n" not in redacted(url)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            f"rediss://:adm1n@redis:6380/0?ssl_ca_certs=/ca.pem&ssl_password={SECRET}",
            f"rediss://{USER}:{PASSWORD}@redis:6380/0?ssl_ca_certs=/ca.pem",
        ),
        (f"rediss://redis:6380/0?ssl_password={SECRET}", f"rediss://{USER}:{PASSWORD}@redis:6380/0"),
        (
            f"rediss://redis/0?ssl%5Fpassword={SECRET}&ssl_cert_reqs=required&Password=adm1n&username=op",
            f"rediss://{USER}:{PASSWORD}@redis/0?ssl_cert_reqs=required",
        ),
        (f"rediss://redis/0?db=2;SSL_Password={SECRET}", f"rediss://{USER}:{PASSWORD}@redis/0?db=2"),
        (f"rediss://redis/0?ssl_password=ab#{SECRET}", f"rediss://{USER}:{PASSWORD}@redis/0"),
    ],
)
def test_a_secret_query_parameter_never_reaches_the_workers(url: str, expected: str) -> None:
    got = topology_url(url, USER, PASSWORD)
    assert got == expected
    assert SECRET not in got and "adm1n" not in got
    # what redis-py makes of it: the topology's user and password, and no secret of the operator's
    parsed = parse_url(got.split("#", 1)[0])
    assert parsed["username"] == USER and parsed["password"] == PASSWORD
    assert "ssl_password" not in parsed


def test_what_counts_as_a_secret_parameter() -> None:
    for name in ("password", "ssl_password", "SSL_Password", "ssl%5Fpassword", "pass%77ord", "sentinel_password"):
        assert is_secret_parameter(name), name
    for name in ("db", "ssl_ca_certs", "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "socket_timeout", "protocol"):
        assert not is_secret_parameter(name), name


names = st.sampled_from(["ssl_password", "password", "SSL_PASSWORD", "ssl%5Fpassword", "Pass%77ord"])
others = st.sampled_from(["db=1", "ssl_ca_certs=/ca.pem", "ssl_cert_reqs=required", "protocol=3", "x"])
secrets_ = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="&;#%"), min_size=6)


@settings(max_examples=200, deadline=None)
@given(
    name=names,
    secret=secrets_,
    before=st.lists(others, max_size=3),
    after=st.lists(others, max_size=3),
    separator=st.sampled_from(["&", ";"]),
)
@example(name="ssl_password", secret="requir", before=[], after=["ssl_cert_reqs=required"], separator="&")
def test_no_placement_of_a_secret_parameter_leaks(
    name: str, secret: str, before: list[str], after: list[str], separator: str
) -> None:
    # percent-encoded as a URL would carry it, and also raw (as someone may write it)
    for value in {secret, quote(secret, safe="")}:
        query = separator.join([*before, f"{name}={value}", *after])
        url = f"rediss://:adm1n@redis.example:6380/0?{query}"
        # the secret's value, and only it, is replaced (a value that happens to be part of another
        # parameter, `requir` of `ssl_cert_reqs=required`, is no leak)
        assert redacted(url).split("?", 1)[1] == separator.join([*before, f"{name}=***", *after])
        worker = topology_url(url, USER, PASSWORD)
        assert f"{name}=" not in worker and "adm1n" not in worker
        assert value not in worker.split("?", 1)[-1] or value in separator.join([*before, *after])


def test_the_topologys_secret_holds_no_secret_of_the_operators_url() -> None:
    """What a tenant can read (its topology's Secret, which its pods mount): the topology's own user and
    password, the operator's TLS settings, and neither the operator's password nor its client key's."""
    from test_kubernetes_backend import FakeAclRedis, FakeCore

    from elastream.control.backends.kubernetes import KubernetesBackend
    from elastream.core.topology import parse_manifest
    from support.manifests import edge, manifest, sink, src

    core = FakeCore()
    kube = KubernetesBackend(
        parse_manifest(manifest([src("s"), sink("z")], [edge("s", "z")], name="web")),
        FakeAclRedis(),  # type: ignore[arg-type]
        core,
        {"name": "web", "uid": "u"},
        f"rediss://:adm1n@r:6380/0?ssl_cert_reqs=required&ssl_password={SECRET}&ssl_keyfile=/tls/op.key",
    )
    kube.ensure_config()
    url = core.secrets["web-redis"]["stringData"]["url"]
    password = core.secrets["web-redis"]["stringData"]["redisPassword"]
    assert url == f"rediss://elastream.default.web:{password}@r:6380/0?ssl_cert_reqs=required&ssl_keyfile=/tls/op.key"
    assert SECRET not in str(core.secrets) and "adm1n" not in str(core.secrets)
