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

The CEL rules (`x-kubernetes-validations`) are `elastream.crd.cel`'s.
Defaults are not applied here (the API server validates what was sent; `cel` applies them before the rules).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from elastream.core.rates import shown
from elastream.core.topology import STREAM_NAME_RULE
from elastream.crd.definition import openapi_schema

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
    pattern = node.get("pattern")
    if isinstance(pattern, str) and pattern.endswith("$") and not pattern.endswith("\\$"):
        # Python's `$` also matches before a final newline; the API server's (Go's, ECMA-262's) does not
        out["pattern"] = pattern[:-1] + "\\Z"
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
    "enum": lambda value, options: f"{shown(value)} is unknown; use one of: {', '.join(str(o) for o in options)}",
    "minimum": lambda value, bound: f"{shown(value)} is below {_bound(bound)}; set it to at least {_bound(bound)}",
    "exclusiveMinimum": lambda value, bound: (
        f"{shown(value)} is not above {_bound(bound)}; set it above {_bound(bound)}"
    ),
    "maximum": lambda value, bound: f"{shown(value)} is above {_bound(bound)}; set it to at most {_bound(bound)}",
    "exclusiveMaximum": lambda value, bound: (
        f"{shown(value)} is not below {_bound(bound)}; set it below {_bound(bound)}"
    ),
    "minItems": lambda value, bound: f"has {len(value)} items; give at least {bound}",
    "maxItems": lambda value, bound: f"has {len(value)} items; the CRD allows at most {bound}",
    "maxLength": lambda value, bound: f"is {len(value)} characters long; shorten it to at most {bound}",
    "minLength": lambda value, bound: f"{shown(value)} is too short; give at least {bound} characters",
    "pattern": lambda value, pattern: f"{shown(value)} does not match {pattern}; fix it",
}


#: a wrong type in words, and how to write the right one
_TYPES = {
    "object": ("is not a mapping", "write it as key: value fields"),
    "array": ("is not a list", "write it as a YAML list"),
    "string": ("is not a string", "quote it"),
    "boolean": ("is not true/false", "set true or false"),
    "integer": ("is not an integer", "set it to an integer"),
    "number": ("is not a number", "set it to a number"),
}

#: what a pattern asks for, by the field's name (the pattern itself is the CRD's; this only words it)
_DNS_LABEL = "is not a DNS-1123 label; use lower-case letters, digits and '-' (at most 63)"
_PATTERN_HINTS = {
    **dict.fromkeys(("name", "namespace", "topology"), _DNS_LABEL),
    "module": "is not 'package.module:Class'; name the class the workers import",
    "stream": f"is not a stream name: {STREAM_NAME_RULE} (e.g. out); its key is under the topology's own prefix",
    "cpu": "is not a CPU quantity; write e.g. '2' or '500m'",
}

#: the fields naming a built-in (`logic.builtin`, `source.type`, `sink.type`): a user class may stand instead
_BUILTIN_NAMES = frozenset({"builtin", "type"})


def _type_line(value: Any, node: Mapping[str, Any]) -> str:
    """A wrong type: what it is not and how to write it, with the node's bounds when it is a number."""
    wanted = node.get("type")
    first = wanted if isinstance(wanted, str) else next((t for t in wanted or () if t != "null"), "")
    what, fix = _TYPES.get(first, (f"is not of type {wanted}", "fix it"))
    low = "[" if "minimum" in node else "(" if "exclusiveMinimum" in node else ""
    high = "]" if "maximum" in node else ")" if "exclusiveMaximum" in node else ""
    if first in ("integer", "number") and low and high:
        lower = node.get("minimum", node.get("exclusiveMinimum"))
        upper = node.get("maximum", node.get("exclusiveMaximum"))
        fix += f" in {low}{_bound(lower)}, {_bound(upper)}{high}"
    return f"{shown(value)} {what}; {fix}"


def _enum_line(parts: Sequence[str | int], value: Any, options: Sequence[Any]) -> str:
    line = _VALUE_LINES["enum"](value, options)
    leaf = parts[-1] if parts else ""
    block = parts[-2] if len(parts) >= 2 else ""
    if leaf in _BUILTIN_NAMES and block in ("source", "logic", "sink"):
        line += f" or {block}.module: package.module:Class"
    return line


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
    node = error.schema if isinstance(error.schema, Mapping) else {}
    leaf = parts[-1] if parts else ""
    if kind in ("type", "pattern") and isinstance(leaf, str) and leaf in _PATTERN_HINTS:
        return [(path, f"{path}: {shown(value)} {_PATTERN_HINTS[leaf]}")]
    if kind == "type":
        return [(path, f"{path}: {_type_line(value, node)}")]
    if kind == "enum":
        return [(path, f"{path}: {_enum_line(parts, value, error.validator_value)}")]
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
    for path in _nan_fields(document):
        seen.add(path)
        problems.append(f"{path}: nan is not a finite number; write a number (the API server's JSON has no NaN)")
    for error in errors:
        for path, line in _lines(error):
            if path not in seen:
                seen.add(path)
                problems.append(line)
    return problems


def _nan_fields(document: Any) -> list[str]:
    """The fields holding NaN: YAML can write `.nan`, and every JSON Schema bound lets it through (NaN compares
    false with everything), where the API server never sees one (JSON has none). Infinities break the bounds."""
    found: list[str] = []
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float) and math.isnan(value):
            found.append(field_path(path))
        elif isinstance(value, Mapping):
            stack.extend((child, (*path, str(key))) for key, child in value.items())
        elif isinstance(value, list):
            stack.extend((child, (*path, index)) for index, child in enumerate(value))
    return sorted(found)


_PATH_RE = re.compile(r"^([A-Za-z0-9_.\[\]-]+): ")


def problem_field(line: str) -> str | None:
    """The field a problem line names ('spec.nodes: 0 is below 1; ...' -> 'spec.nodes')."""
    match = _PATH_RE.match(line)
    return match.group(1) if match else None


def _covers(field: str, other: str) -> bool:
    """Whether `other` is `field` or a field inside it ('spec.streams' covers 'spec.streams[4].to')."""
    return other == field or other.startswith((f"{field}.", f"{field}["))


def merge_problems(schema: Sequence[str], rules: Sequence[str], parser: Sequence[str]) -> list[str]:
    """One line per problem, from the schema's problems, the CEL rules' and the parser's. A document the CRD
    accepts is the parser's to judge: its lines. Otherwise the CRD's lines, each rule about a whole list ("every
    stream's to names a vertex") given way to the parser's lines inside that list, which name the entry that
    breaks it and the fix; the parser's other lines are left out (they judge a document the CRD refuses, so they
    may only echo its problems: a slot shortage from a parallelism above its maximum, an unknown vertex because
    the vertex list was too long), so one mistake stays one line."""
    if not schema and not rules:
        return list(parser)
    merged = list(schema)
    for line in rules:
        field = problem_field(line) or ""
        inside = [p for p in parser if field and _covers(field, problem_field(p) or "")]
        merged.extend(inside or [line])
    return merged
