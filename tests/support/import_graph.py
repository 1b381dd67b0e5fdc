"""Architecture checks over the source tree, read with `ast` (no import runs).

The import graph: every `import` and `from ... import` of a module, wherever it stands (at the top, inside a
function, under `if TYPE_CHECKING:`), as an edge to the module it names. A circle hidden by an import inside a
function, or by one that only a type checker runs, is still a circle: the two modules cannot be read or moved
apart, so the graph does not tell those imports from the others.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

from tests.support.source_trees import parse_file


def module_name(root: Path, path: Path) -> str:
    """`root/a/b/c.py` -> `a.b.c`; `root/a/b/__init__.py` -> `a.b`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of the given top-level packages under `root`, by dotted name."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                modules[module_name(root, path)] = path
    return modules


def _known_prefix(name: str, modules: dict[str, Path]) -> str | None:
    """The longest leading part of `name` that is one of `modules` (`a.b.func` -> `a.b`)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _from_base(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module a `from X import ...` reads from, relative imports resolved against `importer`."""
    if node.level == 0:
        return node.module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def imported_modules(importer: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules among `modules` that `importer` (at `path`) imports, from any place in its source."""
    tree = parse_file(path)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(_known_prefix(alias.name, modules) or "")
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, importer, is_package)
            for alias in node.names:
                # `from package import module` imports the module; `from module import name` the module itself.
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else _known_prefix(base, modules) or "")
    found.discard("")
    return found


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Each module of `packages` under `root` -> the modules of those packages it imports."""
    modules = source_modules(root, packages)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def _components(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit on a deep chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                yield sorted(component)


def import_cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every import circle: each group of modules that import one another, and each module that imports itself."""
    cycles = [tuple(component) for component in _components(graph)
              if len(component) > 1 or component[0] in graph.get(component[0], ())]
    return sorted(cycles)
