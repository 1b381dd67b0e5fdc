"""No import circles among the modules of services/, messages/ and loadtest/.

Every import counts: at the top of a module, inside a function, and under `if TYPE_CHECKING:` (tests/support/
import_graph.py). An import moved into a function still ties the two modules together; it only hides the circle.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.import_graph import import_cycles, import_graph

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("services", "messages", "loadtest")

def test_the_source_tree_has_no_import_circle():
    cycles = set(import_cycles(import_graph(REPO, PACKAGES)))
    assert not cycles, "import circles (every import counts, in functions and under TYPE_CHECKING too):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in sorted(cycles))


def _write(root: Path, relative: str, source: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")


def test_a_planted_circle_is_reported_wherever_its_import_hides(tmp_path):
    """One circle hidden under TYPE_CHECKING (a relative import), one inside a function (`from package import
    module`), and a module pair that imports one way only."""
    _write(tmp_path, "pkg/__init__.py", "")
    _write(tmp_path, "pkg/typed_a.py", """
        from pkg import typed_b
    """)
    _write(tmp_path, "pkg/typed_b.py", """
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from .typed_a import Thing
    """)
    _write(tmp_path, "pkg/sub/__init__.py", "")
    _write(tmp_path, "pkg/sub/late_a.py", """
        import pkg.sub.late_b
    """)
    _write(tmp_path, "pkg/sub/late_b.py", """
        def later():
            from pkg.sub import late_a
            return late_a
    """)
    _write(tmp_path, "pkg/one_way.py", """
        from ..pkg import typed_a
        from pkg.sub.late_a import something
    """)
    cycles = import_cycles(import_graph(tmp_path, ["pkg"]))
    assert cycles == [("pkg.sub.late_a", "pkg.sub.late_b"), ("pkg.typed_a", "pkg.typed_b")]


def test_a_circle_through_three_modules_is_reported_once(tmp_path):
    _write(tmp_path, "pkg/__init__.py", "")
    _write(tmp_path, "pkg/a.py", "from . import b\n")
    _write(tmp_path, "pkg/b.py", "from .c import value\n")
    _write(tmp_path, "pkg/c.py", "def f():\n    import pkg.a\n")
    assert import_cycles(import_graph(tmp_path, ["pkg"])) == [("pkg.a", "pkg.b", "pkg.c")]
