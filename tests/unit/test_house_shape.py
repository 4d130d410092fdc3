"""The house's shape, kept: no import circle between elastream's modules (a function-level or `TYPE_CHECKING`
import counts), and no chain of inheritance deeper than one between the project's own classes, mixins
included (exception hierarchies aside). Parts are composed; a circle or a chain is where a seam was cut
across instead of along. The analysis is scripts/architecture.py's (`--shape` prints it)."""

from __future__ import annotations

import sys
from pathlib import Path

from support.paths import REPO

sys.path.insert(0, str(Path(REPO) / "scripts"))
import architecture


def test_no_import_circle_between_modules():
    circles = architecture.import_circles(architecture.modules())
    assert not circles, "import circles (break them along a seam: a port, an outcome, a lower module): " + "; ".join(
        " <-> ".join(c) for c in circles
    )


def test_no_inheritance_deeper_than_one_between_the_projects_classes():
    deep = architecture.deep_inheritance(architecture.modules())
    assert not deep, f"compose parts instead of inheriting: {deep}"


def test_the_shape_checks_find_what_they_look_for(tmp_path, monkeypatch):
    package = tmp_path / "elastream"
    (package / "a").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a" / "__init__.py").write_text("")
    (package / "a" / "one.py").write_text("class Base:\n    pass\n\n\nclass Mixin:\n    pass\n")
    (package / "a" / "two.py").write_text(
        "from elastream.a.one import Base, Mixin\n\n\nclass Middle(Base):\n    pass\n\n\n"
        "class Top(Middle):\n    pass\n\n\nclass Both(Base, Mixin):\n    pass\n\n\n"
        "class Failure(Exception):\n    pass\n\n\nclass Worse(Failure):\n    pass\n"
    )
    (package / "a" / "three.py").write_text("def f():\n    from elastream.a import four\n")
    (package / "a" / "four.py").write_text("from elastream.a import three\n")
    monkeypatch.setattr(architecture, "SOURCE", package)
    architecture.modules.cache_clear()
    try:
        found = architecture.modules()
        assert architecture.import_circles(found) == [["elastream.a.four", "elastream.a.three"]]
        assert architecture.deep_inheritance(found) == {"elastream.a.two.Top": 2, "elastream.a.two.Both": 2}
    finally:
        architecture.modules.cache_clear()
