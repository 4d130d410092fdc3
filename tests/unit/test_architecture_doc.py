"""docs/architecture.md stays true to the code: its generated part is current and every dotted name its prose
cites (`elastream.x.y.Name.attr`) exists."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

from support.paths import REPO

DOC = f"{REPO}/docs/architecture.md"


def test_the_generated_diagram_and_module_map_are_current():
    done = subprocess.run(
        [sys.executable, f"{REPO}/scripts/architecture.py", "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def resolve(dotted: str) -> object:
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(dotted)


def test_every_name_the_prose_cites_exists():
    with open(DOC) as file:
        prose = file.read().split("<!-- begin: generated", 1)[0]
    cited = sorted(set(re.findall(r"`(elastream(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`", prose)))
    assert len(cited) >= 10, "the prose should walk through the code by name"
    missing = []
    for name in cited:
        try:
            resolve(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert not missing, f"docs/architecture.md cites names the code does not have: {missing}"
