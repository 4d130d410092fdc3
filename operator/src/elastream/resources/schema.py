"""Checks of a manifest against the CRD's openAPIV3Schema with `jsonschema`, one line per problem in the
CLI's style ("<field>: <what>; <fix>").

`jsonschema` validates JSON Schema, and a CRD's schema is OpenAPI v3 with the Kubernetes structural-schema
extensions, so `to_json_schema` maps the few keywords that differ (nothing else is rewritten):

- `x-kubernetes-int-or-string: true` becomes a type of integer or string; other `x-kubernetes-*` keys
  (list types, `x-kubernetes-validations`, which `elastream.resources.cel` evaluates) are dropped;
- an object that neither sets `x-kubernetes-preserve-unknown-fields` nor has `additionalProperties` rejects
  fields it does not declare (the API server would prune them; `kubectl apply` rejects them);
- OpenAPI 3.0's boolean `exclusiveMinimum`/`exclusiveMaximum` become JSON Schema's numeric ones, and
  `nullable: true` adds the null type.

Defaults are not applied here (the API server validates what was sent; `cel` applies them before the rules).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from elastream.resources.crd import openapi_schema


def to_json_schema(node: Mapping[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """An OpenAPI v3 (structural) schema as a JSON Schema that `jsonschema` validates the same way."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "anyOf", "exclusiveMinimum", "exclusiveMaximum"):
            continue
        if key == "properties":
            out[key] = {name: to_json_schema(sub, (*path, name)) for name, sub in value.items()}
        elif key == "items" and isinstance(value, Mapping):
            out[key] = to_json_schema(value, (*path, "[]"))
        elif key == "additionalProperties" and isinstance(value, Mapping):
            out[key] = to_json_schema(value, (*path, "{}"))
        elif key in ("allOf", "oneOf"):
            out[key] = [to_json_schema(sub, path) for sub in value]
        elif key == "not":
            out[key] = to_json_schema(value, path)
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    elif "anyOf" in node:
        out["anyOf"] = [to_json_schema(sub, path) for sub in node["anyOf"]]
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if node.get(exclusive) is True and bound in out:
            out[exclusive] = out.pop(bound)
    if node.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    closed = (
        "properties" in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
        and "additionalProperties" not in node
        # metadata is the API server's ObjectMeta: the CRD may only restrict its name
        and path != ("metadata",)
    )
    if closed:
        out["additionalProperties"] = False
    return out


@functools.cache
def json_schema(version: str = "v1alpha1", crd_path: str | None = None) -> dict[str, Any]:
    """The CRD's schema (the packaged CRD's, or the one at `crd_path`) as a JSON Schema (draft 2020-12)."""
    schema = to_json_schema(openapi_schema(version, crd_path))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def field_path(parts: Iterable[str | int]) -> str:
    """('spec', 'vertices', 2, 'parallelism') -> 'spec.vertices[2].parallelism'."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "manifest"


def _bound(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


#: which of several problems at one field is reported (a wrong type makes an enum mismatch redundant)
_PRIORITY = {"type": 0, "required": 1, "additionalProperties": 1, "enum": 2}


def _lines(error: Any) -> list[tuple[str, str]]:
    """(field path, line) for one jsonschema error."""
    parts = list(error.absolute_path)
    path = field_path(parts)
    value = error.instance
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    kind = error.validator
    if kind == "required":
        missing = [p for p in error.validator_value if p not in value and error.message.startswith(repr(p))][:1]
        return [(field_path([*parts, p]), f"{field_path([*parts, p])}: is missing; add it") for p in missing]
    if kind == "additionalProperties":
        known = sorted(schema.get("properties", {}))
        lines = []
        for key in value:
            if key not in known:
                where = field_path([*parts, str(key)])
                lines.append(
                    (where, f"{where}: unknown field; remove it or fix its name (known here: {', '.join(known)})")
                )
        return lines
    if kind == "enum":
        options = ", ".join(str(o) for o in error.validator_value)
        return [(path, f"{path}: {value!r} is unknown; use one of: {options}")]
    if kind == "minimum":
        bound = _bound(error.validator_value)
        return [(path, f"{path}: {value!r} is below {bound}; set it to at least {bound}")]
    if kind == "exclusiveMinimum":
        return [(path, f"{path}: {value!r} is not above {_bound(error.validator_value)}; fix it")]
    if kind == "maximum":
        bound = _bound(error.validator_value)
        return [(path, f"{path}: {value!r} is above {bound}; set it to at most {bound}")]
    if kind == "exclusiveMaximum":
        return [(path, f"{path}: {value!r} is not below {_bound(error.validator_value)}; fix it")]
    if kind == "minItems":
        return [(path, f"{path}: has {len(value)} items; give at least {error.validator_value}")]
    if kind == "maxItems":
        return [(path, f"{path}: has {len(value)} items; the CRD allows at most {error.validator_value}")]
    if kind == "maxLength":
        return [(path, f"{path}: is {len(value)} characters long; shorten it to at most {error.validator_value}")]
    if kind == "minLength":
        return [(path, f"{path}: {value!r} is too short; give at least {error.validator_value} characters")]
    if kind == "pattern":
        return [(path, f"{path}: {value!r} does not match {error.validator_value}; fix it")]
    return [(path, f"{path}: {error.message}; fix it")]


def schema_problems(document: Any, version: str = "v1alpha1", crd_path: str | None = None) -> list[str]:
    """Problems of a manifest against the CRD's schema: one line per field, naming it and the fix."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(json_schema(version, crd_path))
    errors = sorted(
        validator.iter_errors(document),
        key=lambda e: (
            [f"{p:08d}" if isinstance(p, int) else str(p) for p in e.absolute_path],
            _PRIORITY.get(e.validator, 3),
        ),
    )
    seen: set[str] = set()
    problems: list[str] = []
    for error in errors:
        for path, line in _lines(error):
            if path not in seen:
                seen.add(path)
                problems.append(line)
    return problems


_PATH_RE = re.compile(r"^([A-Za-z0-9_.\[\]-]+): ")


def problem_field(line: str) -> str | None:
    """The field a problem line names ('spec.nodes: 0 is below 1; ...' -> 'spec.nodes')."""
    match = _PATH_RE.match(line)
    return match.group(1) if match else None


def merge_problems(schema: Sequence[str], parser: Sequence[str]) -> list[str]:
    """Schema problems the parser does not report about the same field, then the parser's own lines (so a
    field the parser checks keeps the parser's message)."""
    named = {problem_field(line) for line in parser}
    return [line for line in schema if problem_field(line) not in named] + list(parser)
