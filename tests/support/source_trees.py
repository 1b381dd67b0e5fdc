"""Parsing source files into syntax trees for the architecture checks, safe from the collector.

CPython 3.11 keeps one AST-construction depth counter per interpreter, and each parse resets it to the caller's stack
depth. If the cyclic collector runs while a big module's tree is being built, a finalizer may parse too (logging
"Task exception was never retrieved" formats a traceback, and 3.11's traceback parses source lines to place its
carets): the outer parse then ends with the counter where the inner one left it and raises "SystemError: AST
constructor recursion depth mismatch". A test worker has left-over objects from earlier tests, so the checks parse
with the collector paused (a parse makes no cyclic garbage, so the pause costs nothing).
"""

from __future__ import annotations

import ast
import gc
from pathlib import Path


def parse_source(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source)` with no collection (so no finalizer) while the tree is built."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=filename)
    finally:
        if was_enabled:
            gc.enable()


def parse_file(path: Path) -> ast.Module:
    """The syntax tree of the UTF-8 Python file at `path`."""
    return parse_source(path.read_text(encoding="utf-8"), str(path))
