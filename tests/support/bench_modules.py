"""`bench/` scripts loaded as modules for their unit tests (bench/ is not a package)."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

from support.paths import REPO


def load_bench(file: str) -> ModuleType:
    """`bench/<file>` as the module `bench_<its stem>`, registered in `sys.modules` (dataclasses look their
    module up there)."""
    spec = importlib.util.spec_from_file_location(
        f"bench_{file.removesuffix('.py')}", os.path.join(REPO, "bench", file)
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
