"""The README's Architecture section matches the tree: its folder list holds every folder of source files and no
folder that is gone, every file its request's path names exists, and it names every layer of the import contracts.

Each check is a function of a README text and a repository root, so the tests below also run it on a README made
wrong on purpose and see it fail.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A folder belongs in the tree when it holds a tracked file with one of these suffixes. .ci is CI's own folder.
SOURCE_SUFFIXES = (".py", ".sh", ".md", ".yml", ".js", ".html")
SKIPPED_ROOTS = {".ci"}
# Walked only when git cannot list the tracked files (a copy of the tree without .git): what .gitignore keeps out.
IGNORED_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".devrun", ".whl", ".state", "build"}

TREE_LINE = re.compile(r"^(?P<indent> *)(?P<name>[\w.-]+)/(?: |$)")
PATH_SUFFIXES = (".py", ".sh", ".md", ".yml", ".toml", ".js", ".html")


def architecture_section(readme: str) -> str:
    """The text of `## Architecture`, up to the next `## ` heading."""
    start = readme.find("\n## Architecture\n")
    assert start >= 0, "README.md has no '## Architecture' section"
    end = readme.find("\n## ", start + 1)
    return readme[start:] if end < 0 else readme[start:end]


def listed_folders(readme: str) -> list[str]:
    """The folders of the section's ```text block, as paths from the root (`services/gateway/http`).

    One folder a line, `name/` then its description; two more spaces of indent per level below its parent.
    """
    section = architecture_section(readme)
    assert "```text\n" in section, "the Architecture section has no ```text block holding the folder tree"
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    folders: list[str] = []
    parents: list[str] = []  # the folder open at each depth
    for number, line in enumerate(block.splitlines(), 1):
        if not line.strip():
            continue
        match = TREE_LINE.match(line)
        assert match, f"folder tree line {number} is not 'name/  description': {line!r}"
        indent = len(match["indent"])
        assert indent % 2 == 0 and indent // 2 <= len(parents), (
            f"folder tree line {number} ({match['name']}/) is indented {indent} spaces; a folder sits 2 spaces "
            f"deeper than its parent")
        parents = parents[: indent // 2] + [match["name"]]
        folders.append("/".join(parents))
    return folders


def source_folders(root: Path) -> set[str]:
    """Every folder under `root` (the root itself aside) that holds a tracked source file, with its parents."""
    folders: set[str] = set()
    for path in _tracked_files(root):
        if not path.endswith(SOURCE_SUFFIXES) or Path(path).parts[0] in SKIPPED_ROOTS or not (root / path).is_file():
            continue
        parts = Path(path).parts[:-1]
        folders.update("/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
    return folders


def _tracked_files(root: Path) -> list[str]:
    try:
        done = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, timeout=60,
                              check=True)
        return [path for path in done.stdout.split("\0") if path]
    except (OSError, subprocess.SubprocessError):
        relative = (path.relative_to(root) for path in root.rglob("*") if path.is_file())
        return [str(path) for path in relative
                if not any(part in IGNORED_DIRS or part.endswith(".egg-info") for part in path.parts)]


def request_path_files(readme: str) -> list[str]:
    """The backticked file paths (`dir/name.py`) of the `### One request's path` subsection."""
    section = architecture_section(readme)
    start = section.find("\n### One request's path\n")
    assert start >= 0, "the Architecture section has no '### One request's path' subsection"
    text = section[start:]
    end = text.find("\n### ", 1)
    text = text if end < 0 else text[:end]
    return [token for token in re.findall(r"`([^`\s]+)`", text) if "/" in token and token.endswith(PATH_SUFFIXES)]


def layer_packages(root: Path) -> list[str]:
    """The packages of pyproject.toml's `layers` contract."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(contract["layers"] for contract in contracts if contract["type"] == "layers")
    return [package.strip(" ()") for layer in layers for package in re.split(r"[|:]", layer)]


def tree_problems(readme: str, root: Path) -> list[str]:
    listed = listed_folders(readme)
    problems = [f"the README lists {folder}/ twice" for folder in sorted({f for f in listed if listed.count(f) > 1})]
    problems += [f"the README lists {folder}/, which does not exist" for folder in listed
                 if not (root / folder).is_dir()]
    problems += [f"{folder}/ holds source files but the README's folder tree does not list it"
                 for folder in sorted(source_folders(root) - set(listed))]
    return problems


def path_problems(readme: str, root: Path) -> list[str]:
    files = request_path_files(readme)
    if len(files) < 10:  # the parsing broke, or the section lost its files: either way it no longer shows the path
        return [f"'One request's path' names only {len(files)} files in backticks: {files}"]
    return [f"'One request's path' names {name}, which does not exist" for name in dict.fromkeys(files)
            if not (root / name).is_file()]


def layer_problems(readme: str, root: Path) -> list[str]:
    section = architecture_section(readme)
    return [f"the Architecture section does not name the layer `{package}` (pyproject.toml's layers contract)"
            for package in layer_packages(root) if f"`{package}`" not in section]


README = (REPO / "README.md").read_text()


def test_the_folder_tree_lists_every_source_folder_and_only_those():
    problems = tree_problems(README, REPO)
    assert not problems, "\n".join(problems)


def test_every_file_on_the_request_path_exists():
    problems = path_problems(README, REPO)
    assert not problems, "\n".join(problems)


def test_the_layers_are_those_of_the_import_contracts():
    problems = layer_problems(README, REPO)
    assert not problems, "\n".join(problems)


def test_a_wrong_readme_fails_each_check():
    """A folder that is gone, a folder left out, a file that is gone and a layer left out are each reported."""
    wrong = (README.replace("  results/ ", "  resluts/ ", 1)
             .replace("    ws/ ", "    wss/ ", 1)
             .replace("`services/decode/intake.py`", "`services/decode/admission.py`", 1)
             .replace("`services.metrics`", "`services.metrix`", 1))
    assert wrong.count("resluts/") == wrong.count("wss/") == wrong.count("decode/admission.py") == 1

    tree = tree_problems(wrong, REPO)
    assert "the README lists loadtest/resluts/, which does not exist" in tree
    assert "the README lists services/gateway/wss/, which does not exist" in tree
    assert "services/gateway/ws/ holds source files but the README's folder tree does not list it" in tree
    paths = path_problems(wrong, REPO)
    assert "'One request's path' names services/decode/admission.py, which does not exist" in paths
    assert any("`services.metrics`" in problem for problem in layer_problems(wrong, REPO))


def test_a_folder_nested_under_the_wrong_parent_fails():
    """Indentation is the parent: `codec/` moved under engine/ names services/engine/codec, which does not exist."""
    lines = README.splitlines(keepends=True)
    model = next(i for i, line in enumerate(lines) if line.startswith("  model/ "))
    codec = next(i for i, line in enumerate(lines) if line.startswith("    codec/ ") and i > model)
    engine = next(i for i, line in enumerate(lines) if line.startswith("  engine/ "))
    moved = lines[:codec] + lines[codec + 1:]
    moved.insert(engine + 1, lines[codec])
    problems = tree_problems("".join(moved), REPO)
    assert "the README lists services/engine/codec/, which does not exist" in problems
    assert "services/model/codec/ holds source files but the README's folder tree does not list it" in problems
