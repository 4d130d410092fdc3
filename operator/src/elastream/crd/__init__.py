"""The StreamTopology contract, checked wherever a manifest enters without the API server: the CRD
(crds/streamtopology.yaml, the one copy kept by hand; the package's streamtopology.yaml is a symlink to it), its
openAPIV3Schema checked with `jsonschema` (`schema`), and its CEL rules evaluated with the `cel` library (`cel`).
A rule is written once, in the CRD; nothing here repeats one in Python.

`check_manifest` runs the contract before the parser (`elastream.core.topology.parse_manifest`, which keeps what
the CRD does not say: the graph, slots, and the rest its module docstring lists) and merges both into one line
per field. Every manifest the API server has not admitted enters through it: `elastream validate` and the other
commands' files (`load_manifest`), a worker's topology file, a spec read back from a ConfigMap.
This lives outside `core` because `core` stays pure (no jsonschema, no cel; import-linter checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from elastream.crd.cel import RuleError, all_rules, apply_defaults, cel_problems, compiled
from elastream.crd.definition import CRD_FILE, crd, crd_text, openapi_schema
from elastream.crd.schema import (
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
    "problem_field",
    "schema_problems",
    "to_json_schema",
]


def contract_problems(document: Any, *, crd_path: str | None = None, version: str = "v1alpha1") -> list[str]:
    """What the API server would refuse: the schema's problems, then the CEL rules' messages (a rule is not
    run on a node the schema already found a problem under). One line per field."""
    schema, rules = _contract(document, crd_path, version)
    return schema + rules


def _contract(document: Any, crd_path: str | None, version: str = "v1alpha1") -> tuple[list[str], list[str]]:
    """The schema's problems and the CEL rules' (not run under a node the schema found a problem in)."""
    schema = schema_problems(document, version, crd_path)
    if not isinstance(document, Mapping):
        return schema, []
    invalid = [problem_field(line) or "manifest" for line in schema]
    return schema, cel_problems(document, openapi_schema(version, crd_path), invalid)


def check_manifest(document: Any, *, crd_path: str | None = None) -> Topology:
    """A manifest the API server has not admitted, checked as it would be: the contract (schema and rules), then
    the parser. The `Topology`, or `TopologyError` with one line per problem (`merge_problems`). A document too
    deep or too big to walk is refused first, in one line, before anything walks it."""
    from elastream.core.topology import TopologyError, parse_manifest
    from elastream.core.topology.document import shape_problem

    if isinstance(document, Mapping) and (too_big := shape_problem(document)) is not None:
        raise TopologyError([too_big])
    schema, rules = _contract(document, crd_path)
    try:
        topology = parse_manifest(document)
        parser: list[str] = []
    except TopologyError as exc:
        parser = exc.problems
    if schema or rules or parser:
        raise TopologyError(merge_problems(schema, rules, parser))
    return topology


def load_manifest(path: str) -> Topology:
    """A manifest file read within the bounds (`read_manifest_document`), then `check_manifest`."""
    from elastream.core.topology import read_manifest_document

    return check_manifest(read_manifest_document(path))
