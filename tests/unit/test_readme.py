"""The README tells the truth: its first lines are the two commands, its settings tables match the code, and the
tests its faults table names exist."""

import re
from pathlib import Path

from services.runtime.settings_table import settings_markdown

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_first_lines_are_the_run_and_test_commands():
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2
    assert "voxmesh up" in block[0] and "pip install torch==2.13.0" in block[0]
    assert "tests/install.sh" in block[1] and "pytest" in block[1]
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert "bash tests/install.sh" in ci and ".venv/bin/python -m pytest -q" in ci


def test_settings_section_matches_the_settings_classes():
    section = README.split("<!-- settings:begin -->\n", 1)[1].split("<!-- settings:end -->", 1)[0]
    assert section == settings_markdown(), "regenerate with: python -m services.runtime.settings_table"


def test_every_test_the_faults_table_names_exists():
    table = README.split("## Faults survived", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", table)
    assert len(named) >= 15, "the table names the test that proves each fault"
    root = Path(__file__).resolve().parents[2]
    for path, test in named:
        source = (root / path).read_text()
        assert not test or re.search(rf"^(async )?def {test}\(", source, re.MULTILINE), f"{path}::{test} is gone"
