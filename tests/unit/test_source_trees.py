"""parse_source: a finalizer that parses while a big tree is being built does not break the outer parse."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

from tests.support.source_trees import parse_file, parse_source

BIG_MODULE = Path(__file__).resolve().parents[2] / "services" / "model" / "prompt.py"


class ParsesWhenCollected:
    """Cyclic garbage whose finalizer parses, as a logged traceback does in Python 3.11."""

    parsed: list[ast.Module] = []

    def __init__(self) -> None:
        self.itself = self

    def __del__(self) -> None:
        ParsesWhenCollected.parsed.append(ast.parse("total = (1 +\n 2)"))


def test_a_parse_survives_garbage_that_parses_when_collected():
    source = BIG_MODULE.read_text(encoding="utf-8")
    gc.collect()
    finalized_before = len(ParsesWhenCollected.parsed)
    for _ in range(20):
        ParsesWhenCollected()  # garbage the next collection frees: a build of hundreds of nodes triggers one

    tree = parse_source(source, str(BIG_MODULE))

    assert ast.dump(tree) == ast.dump(ast.parse(source))
    assert gc.isenabled()
    gc.collect()
    assert len(ParsesWhenCollected.parsed) - finalized_before == 20  # the finalizers did run, once the parse was done


def test_a_paused_collector_stays_paused():
    gc.disable()
    try:
        parse_file(BIG_MODULE)
        assert not gc.isenabled()
    finally:
        gc.enable()
