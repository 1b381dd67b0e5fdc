"""Architecture checks over the source tree, read with `ast` (no module is imported): plain functions of a root
folder, so that a test can run them on the repository and on a temporary tree with a planted violation."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.source_trees import parse_file

SOURCE_PACKAGES = ("services", "messages")


@dataclass(frozen=True, slots=True)
class Finding:
    """One place that breaks a rule: the file (relative to the root, POSIX form), its line and what is there."""

    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def source_paths(root: Path, packages: Iterable[str] = SOURCE_PACKAGES) -> Iterator[Path]:
    """Every .py file under the given top-level packages of `root` (sorted within each), caches left out."""
    for package in packages:
        yield from (path for path in sorted((root / package).rglob("*.py")) if "__pycache__" not in path.parts)


def python_files(root: Path, packages: Iterable[str] = SOURCE_PACKAGES) -> Iterator[tuple[str, ast.Module]]:
    """(path relative to `root`, parsed module) of every .py file under the given top-level packages."""
    for path in source_paths(root, packages):
        yield path.relative_to(root).as_posix(), parse_file(path)


_ENVIRONMENT_NAMES = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})


def environment_reads(root: Path, packages: Iterable[str] = SOURCE_PACKAGES) -> list[Finding]:
    """Every place that reaches the process environment: `os.environ` (read, copied or handed on), `os.getenv`, and
    `from os import environ` or `getenv`. A parameter that happens to be called `environ` is no read: its caller
    passed a mapping in."""
    findings = []
    for path, tree in python_files(root, packages):
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in _ENVIRONMENT_NAMES
                    and isinstance(node.value, ast.Name) and node.value.id == "os"):
                findings.append(Finding(path, node.lineno, f"os.{node.attr}"))
            elif isinstance(node, ast.ImportFrom) and node.module == "os":
                for alias in node.names:
                    if alias.name in _ENVIRONMENT_NAMES:
                        findings.append(Finding(path, node.lineno, f"from os import {alias.name}"))
    return findings


def _imported_modules(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, module) of every import anywhere in the module (inside functions and `if TYPE_CHECKING:` too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr in ("jit", "autotune", "heuristics") and (
        isinstance(target.value, ast.Name) and target.value.id == "triton")


def triton_uses(root: Path, packages: Iterable[str] = SOURCE_PACKAGES) -> list[Finding]:
    """Every import of triton (or of a module of it) and every function decorated `@triton.jit` (or autotune,
    heuristics) under the given packages."""
    findings = []
    for path, tree in python_files(root, packages):
        for line, module in _imported_modules(tree):
            if module == "triton" or module.startswith("triton."):
                findings.append(Finding(path, line, f"import {module}"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    if _is_triton_jit(decorator):
                        findings.append(Finding(path, node.lineno, f"@triton kernel {node.name}"))
    return findings


def imports_outside(root: Path, package: str, allowed: Iterable[str]) -> list[Finding]:
    """Imports of the `services` and `messages` trees made by modules of `package` (a folder path like
    `services/kernels`) that name no module of `allowed` (dotted prefixes)."""
    prefixes = tuple(allowed)
    findings = []
    top = package.split("/", 1)[0]
    for path, tree in python_files(root, (top,)):
        if not path.startswith(package + "/"):
            continue
        for line, module in _imported_modules(tree):
            first = module.split(".", 1)[0]
            if first in SOURCE_PACKAGES and not any(module == p or module.startswith(p + ".") for p in prefixes):
                findings.append(Finding(path, line, f"import {module}"))
    return findings
