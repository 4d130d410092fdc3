"""The user code a manifest names (`module: "package.module:Class"`): found and checked here, so that whoever
starts workers (`elastream run`) refuses a typo in one line before any process starts, and the worker loads the
same class the same way (`elastream.runtime.operators.loading` wraps it for the executor).
"""

from __future__ import annotations

import importlib

from elastream.core.topology import Vertex


class OperatorLoadError(Exception):
    """A `module:Class` named in the manifest cannot be loaded (message names the vertex and the fix)."""


def load_class(vertex: Vertex) -> type:
    """The user class named by `module: package.module:Class`; `OperatorLoadError` names the vertex and fix."""
    spec = str(vertex.config["module"])
    module_name, _, class_name = spec.partition(":")
    where = f"spec.vertices[{vertex.name}].{vertex.kind}.module"
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise OperatorLoadError(
            f"{where}: cannot import {module_name!r} ({type(exc).__name__}: {exc}); "
            "install the package in the worker image or fix the name"
        ) from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise OperatorLoadError(f"{where}: module {module_name!r} has no class {class_name!r}; fix the name")
    if vertex.kind == "source":
        needed: tuple[str, ...] = ("open", "poll")
    elif vertex.kind == "sink" and vertex.config.get("delivery") == "exactly-once":
        needed = ("last_committed", "commit_batch")  # the two-phase sink: it stores a batch and its marker at once
    else:
        needed = ("process",)
    missing = [m for m in needed if not callable(getattr(cls, m, None))]
    if missing:
        raise OperatorLoadError(f"{where}: class {spec} has no {', '.join(missing)}(); see the operator API in README")
    return cls
