"""The CRD's CEL rules (`x-kubernetes-validations`), evaluated offline with the `cel` module of the
common-expression-language package (Python bindings of the Rust `cel` crate).

Each rule is written once, in the CRD; `elastream validate` runs it here as the API server would on
`kubectl apply`: on the object after the schema's defaults are applied, with `self` bound to the value of the
schema node the rule sits on. A broken rule is reported on `<node path><fieldPath>` (the API server's field
path) with the rule's `message`, in the CLI's one-line style ("spec.scaling.auto.maxNodes: autoscaler bounds:
...").

The rules use only standard CEL: `has()`, the `all()`/`exists()` macros, `size()`, comparisons, arithmetic
and the ternary operator. None of Kubernetes' CEL extension libraries (lists, regex, URLs, quantities,
`isSorted`, `format`...) is used, so a standard CEL implementation evaluates every one; a rule that uses one
later fails here on the examples (`test_crd.py::test_every_example_passes_the_schema_and_the_rules`).
Transition rules (those reading `oldSelf`) need the stored object and are skipped: validate has no old object.

Why this library and not cel-python (`celpy`, pure Python): the rule "every stream's from names a vertex" is
streams × vertices evaluations, and at the CRD's maxItems (512 × 128) cel-python took 30 s where this one
takes 0.05 s; `elastream validate` must refuse a hostile manifest as fast as it accepts a small one.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from elastream.crd.schema import field_path


class RuleError(ValueError):
    """A CEL rule of the CRD does not compile: the CRD is broken, not the manifest."""


@dataclass(frozen=True)
class Rule:
    """One `x-kubernetes-validations` entry of the CRD."""

    text: str
    message: str
    field_path: str = ""
    #: CEL giving the message from the value (the API server prefers it to `message` when it evaluates)
    message_expression: str = ""

    @property
    def transition(self) -> bool:
        """Whether the rule compares with the stored object (`oldSelf`), which validate does not have."""
        return "oldSelf" in self.text


@functools.cache
def compiled(text: str) -> Any:
    """The rule's compiled program; `RuleError` when it does not compile."""
    import cel  # here, not at the top: importing it costs 0.1 s (it loads its command line), and a worker
    # process imports the CLI modules that import this one without ever running a rule

    try:
        return cel.compile(text)
    except ValueError as exc:  # the library's syntax error, with the position on a later line
        raise RuleError(f"CEL rule {text!r} does not compile: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def rules_of(node: Mapping[str, Any]) -> list[Rule]:
    """The CEL rules on one schema node."""
    return [
        Rule(
            item["rule"],
            item.get("message") or f"failed rule: {item['rule']}",
            item.get("fieldPath", ""),
            item.get("messageExpression", ""),
        )
        for item in node.get("x-kubernetes-validations", [])
    ]


def all_rules(schema: Mapping[str, Any]) -> list[Rule]:
    """Every CEL rule anywhere in a schema (the whole tree, whether a manifest reaches the node or not)."""
    found = rules_of(schema)
    for sub in _children(schema):
        found += all_rules(sub)
    return found


def _children(node: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield from node.get("properties", {}).values()
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), Mapping):
            yield node[key]


def apply_defaults(node: Mapping[str, Any], value: Any) -> Any:
    """The API server's defaulting: a missing field with a default gets it, then its own fields theirs."""
    if isinstance(value, dict) and "properties" in node:
        for name, sub in node["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
        return [apply_defaults(node["items"], item) for item in value]
    return value


def _nodes(node: Mapping[str, Any], value: Any, path: tuple[str | int, ...]) -> Iterator[tuple[Any, Any, Any]]:
    """(schema node, value, field path) for every value of the object that its schema describes."""
    yield node, value, path
    if isinstance(value, Mapping):
        for name, sub in node.get("properties", {}).items():
            if name in value:
                yield from _nodes(sub, value[name], (*path, name))
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping):
            for key, item in value.items():
                yield from _nodes(extra, item, (*path, str(key)))
    elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
        for index, item in enumerate(value):
            yield from _nodes(node["items"], item, (*path, index))


def _message(rule: Rule, value: Any) -> str:
    """The rule's messageExpression on the value, or its message when it has none or it fails (as the API
    server does)."""
    if not rule.message_expression:
        return rule.message
    try:
        message = compiled(rule.message_expression).execute({"self": value})
    except (KeyError, TypeError, ValueError, RuntimeError):
        return rule.message
    return message if isinstance(message, str) and message.strip() else rule.message


def _holds(rule: Rule, value: Any) -> bool | str:
    """True when `value` passes the rule, False when it breaks it, the reason when CEL cannot evaluate it."""
    program = compiled(rule.text)
    try:
        result = program.execute({"self": value})
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # a missing field, mismatched types
        return f"no field {exc}" if isinstance(exc, KeyError) else _first_line(exc)
    if not isinstance(result, bool):
        return f"the rule gives {result!r}, not true or false"
    return result


def _within(field: str, node: str) -> bool:
    return field == node or field.startswith((f"{node}.", f"{node}["))


def cel_problems(document: Any, schema: Mapping[str, Any], invalid: Iterable[str] = ()) -> list[str]:
    """The rules `document` breaks, one line each: `<field>: <the rule's message>`. A rule on a node under
    which the schema found a problem (`invalid`: the fields it named) is not run: rules expect values of the
    declared types, and that node's problem is reported already."""
    invalid = list(invalid)
    if "manifest" in invalid:  # the document as a whole is wrong: no node's type can be trusted
        return []
    problems: list[str] = []
    try:  # what the API server sees: JSON (kubectl sends a YAML date as a string, a number key as a string)
        sent = json.loads(json.dumps(document, default=str))
    except (TypeError, ValueError):  # a key JSON cannot hold (a YAML sequence as a key): not a manifest at all
        return []
    defaulted = apply_defaults(schema, sent)
    for node, value, path in _nodes(schema, defaulted, ()):
        node_path = field_path(path)
        if any(_within(field, node_path) for field in invalid):
            continue
        for rule in rules_of(node):
            if rule.transition:
                continue
            where = node_path
            if rule.field_path:
                where = f"{node_path}{rule.field_path}" if path else rule.field_path.lstrip(".")
            holds = _holds(rule, value)
            if holds is False:
                problems.append(f"{where}: {_message(rule, value)}")
            elif holds is not True:
                problems.append(f"{where}: rule {rule.text!r} cannot be evaluated ({holds}); fix the field")
    return problems
