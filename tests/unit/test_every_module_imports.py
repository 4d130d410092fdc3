"""Every module of the package imports: mypy runs with `ignore_missing_imports`, so an import of a module that a
move removed would pass lint and fail only when that code path runs."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import elastream

#: every module but `elastream.__main__`, which runs the command line when imported
MODULES = sorted(
    m.name for m in pkgutil.walk_packages(elastream.__path__, "elastream.") if m.name != "elastream.__main__"
)


def test_the_walk_finds_the_layers():
    assert {"elastream.core.ports", "elastream.control.resources", "elastream.runtime.worker"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_the_module_imports(module: str):
    importlib.import_module(module)
