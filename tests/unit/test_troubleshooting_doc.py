"""docs/troubleshooting.md documents every condition reason and every event reason the code has (read from
elastream.core.status, so a new reason without its docs fails here), marks as Warning the events the control
plane posts as warnings (found in the source by their `emit(EventReason.X, ..., warning=True)` calls), has the
sections the alert rules' runbook_urls point at, and its links resolve."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import yaml
from test_alert_rules import EXPECTED_ALERTS

from elastream.core import status
from elastream.core.status import EventReason

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
DOC = DOCS / "troubleshooting.md"
SOURCE = REPO / "operator" / "src" / "elastream"


def condition_names() -> set[str]:
    """Every condition type and reason of elastream.core.status: its module-level CamelCase string constants."""
    names = {
        value
        for name, value in vars(status).items()
        if name.isupper() and isinstance(value, str) and re.fullmatch(r"[A-Z][A-Za-z]+", value)
    }
    assert {"StateLost", "AsExpected", "Stalled"} <= names  # the scan finds what is there
    return names


def headings(text: str) -> list[str]:
    return [line.lstrip("#").strip().replace("`", "") for line in text.splitlines() if re.match(r"#{1,6} ", line)]


def table_rows(text: str) -> dict[str, list[str]]:
    """The rows of the document's tables by their first cell (backticks removed), each as its cells."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"[|\s:-]+", line):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            rows[cells[0].replace("`", "")] = cells
    return rows


def section(text: str, title: str) -> str:
    """The text of the `## title` section, up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"docs/troubleshooting.md has no section '## {title}'"
    return match.group(1)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for heading in headings(path.read_text()):
        anchor, n = slug(heading), 1
        while anchor in found:  # GitHub numbers repeated headings: x, x-1, x-2
            anchor, n = f"{slug(heading)}-{n}", n + 1
        found.add(anchor)
    return found


def emitted_events() -> tuple[set[str], set[str]]:
    """(Warning, Normal): the EventReasons the source emits as `emit(EventReason.X, message, warning=...)` with
    warning True, and with no warning or False. A reason chosen at run time (a variable, a conditional) or a
    warning flag computed at run time counts in neither: the table must still list it (every EventReason)."""
    warning: set[str] = set()
    normal: set[str] = set()
    for path in SOURCE.rglob("*.py"):
        for call in calls_named(ast.parse(path.read_text()), "emit"):
            reason = call.args[0] if call.args else None
            if not (
                isinstance(reason, ast.Attribute)
                and isinstance(reason.value, ast.Name)
                and reason.value.id == "EventReason"
            ):
                continue
            flag = next((k.value for k in call.keywords if k.arg == "warning"), None)
            if flag is None and len(call.args) > 2:
                flag = call.args[2]
            value = EventReason[reason.attr].value
            if flag is None or (isinstance(flag, ast.Constant) and flag.value is False):
                normal.add(value)
            elif isinstance(flag, ast.Constant) and flag.value is True:
                warning.add(value)
    return warning, normal


def calls_named(tree: ast.AST, method: str) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method:
            yield node


def test_every_condition_type_and_reason_is_documented() -> None:
    text = DOC.read_text()
    documented = set(headings(text)) | set(table_rows(text))
    missing = sorted(condition_names() - documented)
    assert not missing, (
        f"docs/troubleshooting.md has no heading or table row for {missing} (elastream.core.status): say what "
        "each means, what to check and what to do"
    )


def test_every_event_reason_has_a_row_of_the_events_table() -> None:
    rows = table_rows(section(DOC.read_text(), "Events"))
    missing = sorted(reason.value for reason in EventReason if reason.value not in rows)
    assert not missing, f"the Events table of docs/troubleshooting.md has no row for {missing}"
    unknown = sorted(set(rows) - {reason.value for reason in EventReason} - {"event"})
    assert not unknown, f"the Events table lists reasons the code does not have: {unknown}"


def test_warning_events_are_marked_warning_and_normal_ones_normal() -> None:
    warning, normal = emitted_events()
    # the scan sees what is there: one of each kind the controller is known to post
    assert EventReason.STATE_LOST in warning and EventReason.SCALED in normal
    rows = table_rows(section(DOC.read_text(), "Events"))
    not_warning = sorted(r for r in warning if "Warning" not in rows[r][1])
    assert not not_warning, f"posted as Warning events but not marked Warning in the table: {not_warning}"
    not_normal = sorted(r for r in normal - warning if "Normal" not in rows[r][1])
    assert not not_normal, f"posted as Normal events only but not marked Normal in the table: {not_normal}"


def test_every_alert_has_its_section() -> None:
    text = DOC.read_text()
    for alert in sorted(EXPECTED_ALERTS):
        # exactly the alert's name: the runbook_url anchors are #elastreamtopologystalled and so on
        assert re.search(rf"^## {alert}$", text, re.MULTILINE), f"no '## {alert}' section"
        assert alert.lower() in anchors(DOC)


def test_the_alert_rules_runbook_urls_point_at_sections() -> None:
    rules = REPO / "charts" / "elastream" / "files" / "alerts.yaml"
    found = anchors(DOC)
    if not rules.exists():  # the rules are shipped by the chart; without them the contract's names stand
        return
    for group in yaml.safe_load(rules.read_text())["groups"]:
        for rule in group["rules"]:
            url = rule["annotations"]["runbook_url"]
            assert url.split("#")[0].endswith("docs/troubleshooting.md"), url
            assert url.split("#")[1] in found, f"{rule['alert']}: {url} names no section of the doc"


def test_the_uninstall_section_names_the_operators_finalizer() -> None:
    handlers = (SOURCE / "handlers" / "topology.py").read_text()
    finalizer = re.search(r'persistence\.finalizer = "([^"]+)"', handlers)
    assert finalizer, "elastream.handlers.topology no longer sets kopf's finalizer name as this test reads it"
    uninstalling = section(DOC.read_text(), "Uninstalling")
    assert finalizer.group(1) in uninstalling
    assert '"path":"/metadata/finalizers"' in uninstalling  # how to remove a stuck one
    assert "helm uninstall" in uninstalling and "kubectl delete crd streamtopologies.elastream.dev" in uninstalling
    # the order of the first command block: topologies first (and waited for), then the release, then the CRD
    commands = re.search(r"```sh\n(.*?)```", uninstalling, re.DOTALL)
    assert commands, "the Uninstalling section has no command block"
    steps = ("kubectl delete topo", "kubectl wait --for=delete topo", "helm uninstall", "kubectl delete crd")
    order = [commands.group(1).find(step) for step in steps]
    assert -1 not in order and order == sorted(order), f"the uninstall commands are not in the order {steps}"


def test_the_links_of_the_doc_resolve() -> None:
    text = DOC.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        page, _, anchor = target.partition("#")
        path = DOC if not page else (DOCS / page).resolve()
        assert path.exists(), f"docs/troubleshooting.md links to {target}: no {path}"
        if anchor:
            assert anchor in anchors(path), f"docs/troubleshooting.md links to {target}: no such heading"
