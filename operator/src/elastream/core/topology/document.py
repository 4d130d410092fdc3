"""Reading a manifest within bounds: one StreamTopology document of a YAML file or text, refused in one line
when it is too big, too deep or an alias bomb (MAX_MANIFEST_BYTES, MAX_DEPTH, MAX_VALUES, MAX_TEXT_CHARS)
before anything walks it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import yaml

from elastream.core.rates import shown
from elastream.core.topology.limits import KIND, MAX_DEPTH, MAX_MANIFEST_BYTES, MAX_TEXT_CHARS, MAX_VALUES
from elastream.core.topology.model import TopologyError


class _TooDeep(yaml.YAMLError):
    def __init__(self, line: int) -> None:
        super().__init__(f"nested deeper than {MAX_DEPTH} levels")
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing a document nested deeper than MAX_DEPTH while it composes it (the
    composer recurses: a deep enough document would end in RecursionError). Aliases are composed as
    references, not copies, so an alias bomb costs what its text does here; `shape_problem` then counts
    what it would expand to and refuses it before anything walks it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark.line + 1)  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def read_manifest_document(path: str) -> Mapping[str, Any]:
    """The one StreamTopology document of a YAML file, read within the bounds (MAX_MANIFEST_BYTES, MAX_DEPTH,
    MAX_VALUES after aliases): `TopologyError` with one line saying what is wrong otherwise."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise TopologyError([f"{path}: cannot read ({exc.strerror}); check the path"]) from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise TopologyError(
            [
                f"{path}: is larger than {MAX_MANIFEST_BYTES // 1024} KiB; a manifest must be smaller "
                "(split the topology)"
            ]
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TopologyError(
            [f"{path}: byte {exc.start} is not UTF-8 ({exc.reason}); save the manifest as UTF-8"]
        ) from None
    return manifest_document_from_text(text, path)


def manifest_document_from_text(text: str, where: str) -> Mapping[str, Any]:
    """The one StreamTopology document of YAML `text` (from `where`, named in the errors), within the same
    bounds as `read_manifest_document`."""
    path = where
    if len(text.encode("utf-8")) > MAX_MANIFEST_BYTES:
        raise TopologyError([f"{path}: is larger than {MAX_MANIFEST_BYTES // 1024} KiB; a manifest must be smaller"])
    try:
        documents = [d for d in yaml.load_all(text, Loader=_BoundedLoader) if d is not None]
    except _TooDeep as exc:
        raise TopologyError(
            [f"{path}: line {exc.line} is nested deeper than {MAX_DEPTH} levels; a manifest is never that deep"]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line_at = f" line {mark.line + 1}" if mark is not None else ""
        raise TopologyError([f"{path}:{line_at} is not valid YAML ({getattr(exc, 'problem', exc)})"]) from None
    except (ValueError, OverflowError) as exc:  # a value YAML cannot construct (a 5000-digit integer, 2024-13-01)
        reason = str(exc).split(";")[0].split(":")[0]
        raise TopologyError([f"{path}: holds a value YAML cannot construct ({reason}); fix or quote it"]) from None
    except RecursionError:  # a safety net under the depth bound
        raise TopologyError([f"{path}: is nested too deeply; a manifest is never that deep"]) from None
    kinds = [d for d in documents if isinstance(d, dict) and d.get("kind") == KIND]
    if len(kinds) != 1:
        raise TopologyError([f"{path}: holds {len(kinds)} {KIND} documents; put exactly one {KIND} in the file"])
    too_big = shape_problem(kinds[0])
    if too_big is not None:  # before any caller (the schema check, the parser) walks it
        raise TopologyError([too_big])
    return cast(Mapping[str, Any], kinds[0])


def shape_problem(document: Any) -> str | None:
    """Why `document` is too big or too deep to be a manifest (MAX_DEPTH, MAX_VALUES, MAX_TEXT_CHARS), or
    None. It walks without recursion and stops at the first bound it crosses, so a YAML alias bomb (a value
    shared a billion times) or a deeply nested spec from the API server is refused in microseconds, before
    anything (the parser, a repr, a comparison) walks it whole."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(document, ())]
    values = chars = 0
    while stack:
        value, path = stack.pop()
        values += 1
        if values > MAX_VALUES:
            return (
                f"manifest: holds more than {MAX_VALUES} values (counting each YAML alias as the copy it stands "
                "for); a topology needs far fewer, remove the repetition"
            )
        if len(path) > MAX_DEPTH:
            return f"{_render(path)}: is nested deeper than {MAX_DEPTH} levels; a manifest is never that deep"
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                chars += len(key) if isinstance(key, str) else 0
                stack.append((item, (*path, key)))
        elif isinstance(value, list | tuple):
            stack.extend((item, (*path, i)) for i, item in enumerate(value))
        if chars > MAX_TEXT_CHARS:
            return (
                f"manifest: holds more than {MAX_TEXT_CHARS // 1_048_576} Mi characters of text (counting each "
                "YAML alias as the copy it stands for); shorten it"
            )
    return None


def _render(path: tuple[Any, ...]) -> str:
    """A field path as messages write it (spec.vertices[0].source), its keys cut short."""
    text = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part}]"
        else:
            key = part if isinstance(part, str) and len(part) <= 40 else shown(part)
            text += f".{key}" if text else key
    return text or "manifest"
