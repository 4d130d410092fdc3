"""The StreamTopology contract as `elastream validate` checks it: the CRD (crds/streamtopology.yaml, the one
copy kept by hand; the package's streamtopology.yaml is a symlink to it), its openAPIV3Schema checked with
`jsonschema` (`schema`), and its CEL rules evaluated with the `cel` library (`cel`). A rule is written once, in the
CRD; nothing here repeats one in Python.

`check_manifest` (validate) runs the contract before the parser (`elastream.core.topology.parse_manifest`, which
keeps what a schema cannot say: the graph, slots, and the checks the model needs to be built) and merges both
into one line per field; `load_manifest`/`parse_checked` (the other commands) run the CEL rules before it.
This lives outside `core` because `core` stays pure (no jsonschema, no cel; import-linter checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from elastream.resources.cel import RuleError, all_rules, apply_defaults, cel_problems, compiled
from elastream.resources.crd import CRD_FILE, crd, crd_text, openapi_schema
from elastream.resources.schema import (
    field_path,
    json_schema,
    merge_problems,
    problem_field,
    schema_problems,
    to_json_schema,
)

if TYPE_CHECKING:
    from elastream.core.topology import Topology

__all__ = [
    "CRD_FILE",
    "RuleError",
    "all_rules",
    "apply_defaults",
    "cel_problems",
    "check_manifest",
    "compiled",
    "contract_problems",
    "crd",
    "crd_text",
    "field_path",
    "json_schema",
    "load_manifest",
    "merge_problems",
    "openapi_schema",
    "parse_checked",
    "problem_field",
    "schema_problems",
    "to_json_schema",
]


def contract_problems(document: Any, *, crd_path: str | None = None, version: str = "v1alpha1") -> list[str]:
    """What the API server would refuse: the schema's problems, then the CEL rules' messages (a rule is not
    run on a node the schema already found a problem under). One line per field."""
    problems = schema_problems(document, version, crd_path)
    if not isinstance(document, Mapping):
        return problems
    invalid = [problem_field(line) or "manifest" for line in problems]
    return problems + cel_problems(document, openapi_schema(version, crd_path), invalid)


def check_manifest(document: Mapping[str, Any], *, crd_path: str | None = None) -> Topology:
    """`elastream validate`'s check: the contract (schema and rules), then the parser: the `Topology`, or
    `TopologyError` with one line per field (a field both check is reported once, in the parser's words,
    which name the fix)."""
    return _then_parse(contract_problems(document, crd_path=crd_path), document)


def parse_checked(document: Mapping[str, Any]) -> Topology:
    """How the other commands (`run`, `plan`, `etp`, `simulate`, `analyze`) take a manifest: the CRD's CEL
    rules, then the parser, so a cross-field rule is written once (in the CRD) and holds wherever a manifest
    enters (the API server runs the same rules for the operator). The schema is not checked here (the parser
    checks every field it reads); a rule CEL cannot evaluate on a mistyped value is left to the parser."""
    if not isinstance(document, Mapping):
        return _then_parse([], document)
    return _then_parse(cel_problems(document, openapi_schema(), lenient=True), document)


def load_manifest(path: str) -> Topology:
    """A manifest file read within the bounds (`read_manifest_document`), then `parse_checked`."""
    from elastream.core.topology import read_manifest_document

    return parse_checked(read_manifest_document(path))


def _then_parse(contract: list[str], document: Mapping[str, Any]) -> Topology:
    """The parser after the contract's problems: both merged into one line per field."""
    from elastream.core.topology import TopologyError, parse_manifest

    try:
        topology = parse_manifest(document)
    except TopologyError as exc:
        raise TopologyError(merge_problems(contract, exc.problems)) from None
    except Exception:
        # a value of a type the parser does not expect: the schema has already named it
        if contract:
            raise TopologyError(contract) from None
        raise
    if contract:
        raise TopologyError(contract)
    return topology
