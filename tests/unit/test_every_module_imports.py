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
    assert {"elastream.core.ports", "elastream.control.reconciler", "elastream.runtime.worker"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_the_module_imports(module: str):
    importlib.import_module(module)


def test_the_images_self_checks_import_what_exists():
    """The images' build-time self-checks (`elastream-image-check` in images/*/Dockerfile) import elastream by
    name: a module moved without them fails the image build, which only the e2e tier runs."""
    import glob
    import re

    from support.paths import REPO

    cited: set[tuple[str, str]] = set()
    for dockerfile in glob.glob(f"{REPO}/images/*/Dockerfile"):
        with open(dockerfile) as file:
            text = file.read()
        for module, names in re.findall(r"from (elastream[\w.]*) import ([\w, ]+)", text):
            cited.update((module, name.strip()) for name in names.split(","))
        for modules in re.findall(r"\bimport (elastream[\w., ]+)", text):
            cited.update((module.strip(), "") for module in modules.split(","))
    assert len(cited) >= 5
    for module, name in sorted(cited):
        imported = importlib.import_module(module)
        assert not name or hasattr(imported, name), f"{module} has no {name}"
