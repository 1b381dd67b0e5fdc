"""experiments/ stays outside the product: no module of services/, messages/, loadtest/ or tests/ imports it.

experiments/ holds one-off probes and sweeps (experiments/README.md): not installed, not run by CI, free to rot. A
product module that imported one would break the day the experiment does, so the check reads every module's imports
(its syntax tree: `import experiments...`, `from experiments... import`, `importlib.import_module("experiments...")`)
and fails on any. import-linter's `product-imports-no-experiments` contract says the same for the static graph; this
scan also sees the dynamic form and needs no subprocess.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support.architecture import python_files

REPO = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("services", "messages", "loadtest", "tests")
FORBIDDEN = "experiments"


def imports_of_experiments(root: Path, packages: tuple[str, ...] = PRODUCT_PACKAGES) -> list[str]:
    """`path:line: module` for every import of experiments/ by a module of `packages` under `root`."""
    found = []
    for relative, tree in python_files(root, packages):
        found += [f"{relative}:{line}: {module}" for line, module in _imported_modules(tree)
                  if module == FORBIDDEN or module.startswith(FORBIDDEN + ".")]
    return found


def _imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of each import statement and each `import_module("...")` call with a literal."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Call) and _called_name(node.func) in ("import_module", "__import__") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def test_no_product_module_imports_experiments():
    found = imports_of_experiments(REPO)
    assert not found, "experiments/ is not part of the product (experiments/README.md):\n" + "\n".join(found)


def test_a_planted_import_of_experiments_is_reported(tmp_path):
    """A tree whose services and loadtest import experiments in each form the check reads: every one is reported,
    and the same names in a string, a comment, a relative import or experiments' own imports are not."""
    files = {
        "services/__init__.py": "",
        "services/decode/probe.py": "import experiments.first_replay\n",
        "services/model/fast.py": "from experiments import launch_split as split  # noqa\n",
        "messages/__init__.py": "X = 'import experiments'  # not an import: from experiments import x\n",
        "loadtest/gpu/runner.py": "import importlib\nmod = importlib.import_module('experiments.gemm_choice')\n",
        "loadtest/gpu/local.py": "from .experiments import helper\nimport experimentsbook\n",
        "tests/test_x.py": "def f():\n    import experiments\n",
        "experiments/own.py": "import experiments.gemm_choice\nfrom loadtest.gpu import gpu_common\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    found = imports_of_experiments(tmp_path)

    assert found == ["services/decode/probe.py:1: experiments.first_replay",
                     "services/model/fast.py:1: experiments",
                     "loadtest/gpu/runner.py:2: experiments.gemm_choice",
                     "tests/test_x.py:2: experiments"]
