"""Docstrings name only modules that exist: every backticked dotted name in a docstring of operator/src whose head
is one of elastream's packages (`control.controller`, `elastream.store.registry.Registry`, `core.status.phase`)
names a module of the package, and the first name after the module is defined in it. A module renamed or
folded into another leaves no docstring pointing at it (test_architecture_doc does the same for the
architecture page's prose). A package's own docstring may name its modules without the package (`job.analyze`,
or a list of them, "- `decision`: ..."): those are checked against the package's modules too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from support.paths import REPO

SOURCE = Path(REPO) / "operator" / "src" / "elastream"
PACKAGES = sorted(p.name for p in SOURCE.iterdir() if (p / "__init__.py").exists())
CITED = re.compile(r"`((?:elastream\.)?(?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def module_files() -> dict[str, Path]:
    found = {}
    for path in SOURCE.rglob("*.py"):
        parts = path.relative_to(SOURCE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def docstrings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    found = []
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                found.append((getattr(node, "lineno", 1), text))
    return found


def dangling(name: str, files: dict[str, Path]) -> str | None:
    """Why `name` names nothing, or None when it names a module (and a name defined in it)."""
    parts = name.removeprefix("elastream.").split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in files:
            rest = parts[cut:]
            if rest and rest[0] not in top_level_names(files[module]) and (module + "." + rest[0]) not in files:
                return f"elastream.{module} defines no {rest[0]!r}"
            return None
    return f"no module elastream.{'.'.join(parts[:2])}"


def test_every_module_a_docstring_names_exists():
    files = module_files()
    problems = []
    for path in sorted(files.values()):
        for line, text in docstrings(path):
            for name in sorted(set(CITED.findall(text))):
                why = dangling(name, files)
                if why:
                    problems.append(f"{path.relative_to(REPO)}:{line}: `{name}`: {why}")
    assert not problems, "docstrings name what the code does not have:\n" + "\n".join(problems)


SIBLING = re.compile(r"`([a-z_][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)`")
LISTED = re.compile(r"^\s*- `([a-z_][a-z0-9_]*)`:", re.MULTILINE)


def test_every_module_a_package_docstring_lists_exists():
    files = module_files()
    problems = []
    for package, path in sorted(files.items()):
        if path.name != "__init__.py":
            continue
        text = ast.get_docstring(ast.parse(path.read_text())) or ""
        prefix = f"{package}." if package else ""
        for name in LISTED.findall(text):
            if f"{prefix}{name}" not in files:
                problems.append(f"{path.relative_to(REPO)}: lists `{name}`, which is not a module of the package")
        for name, attribute in SIBLING.findall(text):
            if f"{prefix}{name}" in files:
                why = dangling(f"{prefix}{name}.{attribute}", files)
                if why:
                    problems.append(f"{path.relative_to(REPO)}: `{name}.{attribute}`: {why}")
    assert not problems, "package docstrings name modules the package does not have:\n" + "\n".join(problems)


def test_the_check_finds_a_dangling_name():
    files = module_files()
    assert dangling("control.controller.TopologyController", files) is None
    assert dangling("store.no_such_module", files) is not None
    assert dangling("core.status.no_such_function", files) is not None
