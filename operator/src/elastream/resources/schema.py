"""Checks of a manifest against the CRD's openAPIV3Schema with `jsonschema`, one line per problem in the
CLI's style ("<field>: <what>; <fix>").

`jsonschema` validates JSON Schema, and a CRD's schema is OpenAPI v3 with the Kubernetes structural-schema
extensions. jsonschema ignores keywords it does not know (`x-kubernetes-*`, `nullable`, `description`), so the
schema is used as written except for the few keywords whose meaning differs (`to_json_schema`):

- `x-kubernetes-int-or-string: true` becomes a type of integer or string (its `anyOf` of the two types goes);
- an object that neither sets `x-kubernetes-preserve-unknown-fields` nor has `additionalProperties` rejects
  fields it does not declare (the API server would prune them; `kubectl apply` rejects them);
- OpenAPI 3.0's boolean `exclusiveMinimum`/`exclusiveMaximum` become JSON Schema's numeric ones, and
  `nullable: true` adds the null type.

The CEL rules (`x-kubernetes-validations`) are `elastream.resources.cel`'s.
Defaults are not applied here (the API server validates what was sent; `cel` applies them before the rules).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from elastream.resources.crd import openapi_schema

#: keywords whose value is one subschema, and those whose value is a list of subschemas
_ONE_SUBSCHEMA = {"items": "[]", "additionalProperties": "{}", "not": ""}
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


def to_json_schema(node: Mapping[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """An OpenAPI v3 (structural) schema as a JSON Schema that `jsonschema` validates the same way. Every
    keyword is kept (jsonschema ignores the ones it does not know: `x-kubernetes-*`, `nullable`); subschemas
    are mapped too, and `_structural` rewrites the few keywords whose meaning differs."""
    out = dict(node)
    if isinstance(node.get("properties"), Mapping):
        out["properties"] = {name: to_json_schema(sub, (*path, name)) for name, sub in node["properties"].items()}
    for key, step in _ONE_SUBSCHEMA.items():
        if isinstance(node.get(key), Mapping):
            out[key] = to_json_schema(node[key], (*path, step) if step else path)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [to_json_schema(sub, path) for sub in node[key]]
    _structural(node, out, path)
    return out


def _structural(node: Mapping[str, Any], out: dict[str, Any], path: tuple[str, ...]) -> None:
    """The Kubernetes/OpenAPI 3.0 keywords JSON Schema reads otherwise (the module docstring lists them)."""
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
        out.pop("anyOf", None)  # it only lists the two types again, and would add a second line per mistake
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(node.get(exclusive), bool):
            del out[exclusive]
            if node[exclusive] and bound in out:
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


#: the line for a keyword whose problem is about the value itself: (value, the keyword's value) -> text
_VALUE_LINES: dict[str, Callable[[Any, Any], str]] = {
    "enum": lambda value, options: f"{value!r} is unknown; use one of: {', '.join(str(o) for o in options)}",
    "minimum": lambda value, bound: f"{value!r} is below {_bound(bound)}; set it to at least {_bound(bound)}",
    "exclusiveMinimum": lambda value, bound: f"{value!r} is not above {_bound(bound)}; fix it",
    "maximum": lambda value, bound: f"{value!r} is above {_bound(bound)}; set it to at most {_bound(bound)}",
    "exclusiveMaximum": lambda value, bound: f"{value!r} is not below {_bound(bound)}; fix it",
    "minItems": lambda value, bound: f"has {len(value)} items; give at least {bound}",
    "maxItems": lambda value, bound: f"has {len(value)} items; the CRD allows at most {bound}",
    "maxLength": lambda value, bound: f"is {len(value)} characters long; shorten it to at most {bound}",
    "minLength": lambda value, bound: f"{value!r} is too short; give at least {bound} characters",
    "pattern": lambda value, pattern: f"{value!r} does not match {pattern}; fix it",
}


def _lines(error: Any) -> list[tuple[str, str]]:
    """(field path, line) for one jsonschema error."""
    parts = list(error.absolute_path)
    path = field_path(parts)
    value = error.instance
    kind = error.validator
    if kind == "required":
        missing = [p for p in error.validator_value if p not in value and error.message.startswith(repr(p))][:1]
        return [(field_path([*parts, p]), f"{field_path([*parts, p])}: is missing; add it") for p in missing]
    if kind == "additionalProperties":
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        known = sorted(schema.get("properties", {}))
        unknown = [field_path([*parts, str(key)]) for key in value if key not in known]
        hint = f"remove it or fix its name (known here: {', '.join(known)})"
        return [(where, f"{where}: unknown field; {hint}") for where in unknown]
    if kind in _VALUE_LINES:
        return [(path, f"{path}: {_VALUE_LINES[kind](value, error.validator_value)}")]
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


def _covers(field: str, other: str) -> bool:
    """Whether `other` is `field` or a field inside it ('spec.streams' covers 'spec.streams[4].to')."""
    return other == field or other.startswith((f"{field}.", f"{field}["))


def merge_problems(contract: Sequence[str], parser: Sequence[str]) -> list[str]:
    """The contract's (schema and CEL) problems the parser does not report about the same field or one inside
    it, then the parser's own lines: a field the parser checks keeps the parser's message, which names the
    fix, and a rule about a whole list ("every stream's to names a vertex") gives way to the parser's line
    naming the one entry that breaks it."""
    named = [field for field in map(problem_field, parser) if field]
    kept = [line for line in contract if not any(_covers(problem_field(line) or "", f) for f in named)]
    return kept + list(parser)
