"""The layout keeps its architecture: import layers (import-linter), one meaning per module name, subjects spelled
only in messages/.

The contracts live in pyproject.toml's [tool.importlinter]; they run here with the venv's `lint-imports`, so CI
enforces them with the rest of the suite.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from tests.support.architecture import python_files, source_paths
from tests.support.source_trees import parse_source

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
SOURCE_PACKAGES = ("messages", "services", "loadtest", "tests", "experiments")

# A module name that is a role every package of a kind has, and so means one thing wherever it appears:
#   __init__, __main__: Python's own (a package; `python -m package`);
#   service, settings: each actor's folder has its service and the settings it declares;
#   errors, config, loader: a package's typed errors, its validated configuration, and loading its weights
#     (the talker's in services/model, the codec's in services/model/codec).
ROLE_NAMES = {"__init__.py", "__main__.py", "service.py", "settings.py", "errors.py", "config.py", "loader.py"}

# The roots of voxmesh's subjects and KV keys (messages/subjects.py), and the server's own ($SRV micro discovery,
# $JS JetStream API and advisories, $KV buckets). A literal counts when it is nothing but such a subject: prose
# that mentions one has spaces, so it does not.
SUBJECT_LITERAL = re.compile(r"(?:tts|owner|lease|cancel|part)\.[\w.*>{}-]*|\$(?:SRV|JS|KV)(?:\.[\w.*>{}$-]*)?")
SUBJECTS_ALLOWED = {
    "tests/unit/test_messages_subjects.py": "checks the exact spelling that messages/subjects.py builds",
    "tests/unit/test_architecture.py": "this rule's own examples",
}


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """Run the import-linter contracts of `root`/pyproject.toml over the packages under `root`."""
    assert LINT_IMPORTS.is_file(), f"{LINT_IMPORTS} is missing: pip install -e '.[test]' (it brings import-linter)"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_import_contracts_hold():
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_an_import_from_a_higher_layer_breaks_the_contracts(tmp_path):
    """The same contracts over a copy of the tree in which the model imports the engine (a layer above it)."""
    for package in SOURCE_PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    errors = tmp_path / "services" / "model" / "errors.py"
    errors.write_text(errors.read_text() + "\nfrom services.engine import config as _engine_config  # noqa\n")

    done = lint_imports(tmp_path)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "voxmesh layers BROKEN" in done.stdout
    assert "services.model.errors -> services.engine.config" in done.stdout


def test_an_import_of_experiments_breaks_the_contracts(tmp_path):
    """The same contracts over a copy of the tree in which the device harness imports a module of experiments/."""
    for package in SOURCE_PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "experiments" / "planted.py").write_text("PLANTED = 1\n")
    common = tmp_path / "loadtest" / "gpu" / "gpu_common.py"
    common.write_text(common.read_text() + "\nfrom experiments import planted as _planted  # noqa\n")

    done = lint_imports(tmp_path)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "neither the product nor its tests import experiments/" in done.stdout and "BROKEN" in done.stdout
    assert "loadtest.gpu.gpu_common -> experiments.planted" in done.stdout


def test_no_two_modules_share_a_name():
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in source_paths(REPO, ("services", "messages")):
        relative = path.relative_to(REPO)
        if relative.parts[:2] == ("services", "cli"):
            continue  # services/cli/NAME.py is the command `voxmesh NAME`: the name is the one users type
        by_name[path.name].append(str(relative))
    allowed = ROLE_NAMES
    duplicates = {name: paths for name, paths in by_name.items() if len(paths) > 1 and name not in allowed}
    assert not duplicates, f"one name, several modules (name each after what it does): {duplicates}"


def test_no_subject_is_spelled_outside_messages():
    allowed = SUBJECTS_ALLOWED.keys()
    found = []
    for relative, tree in python_files(REPO, ("services", "loadtest", "tests")):
        if relative in allowed:
            continue
        found += [f"{relative}:{line}: {text!r}" for line, text in _literals_of(tree)
                  if SUBJECT_LITERAL.fullmatch(text)]
    assert not found, "subjects are built by messages.subjects, not spelled:\n" + "\n".join(found)


def test_the_subject_rule_sees_what_it_must():
    """Literals, f-strings and concatenation heads are caught; prose and file names are not."""
    caught = ["tts.req.tiny", "tts.", "lease.*", "part.2", "$SRV.PING", "$SRV.STATS.{x}", "$JS.API.STREAM.INFO.X"]
    ignored = ["the tts.req subject", "owner", "lease", "speech.wav", "part of it", "$SRV is answered by micro"]
    assert all(SUBJECT_LITERAL.fullmatch(text) for text in caught)
    assert not any(SUBJECT_LITERAL.fullmatch(text) for text in ignored)
    source = 'def f(x):\n    """tts.req.tiny in a docstring is prose."""\n    return f"tts.audio.{x}", "tts." + x\n'
    texts = [text for _, text in _literals_of(parse_source(source))]
    assert texts == ["tts.audio.{x}", "tts."]


def _literals_of(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every string literal but docstrings; an f-string reads with `{x}` for each placeholder."""
    skipped = {id(node.body[0].value) for node in ast.walk(tree) if _has_docstring(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skipped.update(id(part) for part in node.values)
            yield node.lineno, "".join(part.value if isinstance(part, ast.Constant) else "{x}" for part in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            yield node.lineno, node.value


def _has_docstring(node: ast.AST) -> bool:
    if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) or not node.body:
        return False
    first = node.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
