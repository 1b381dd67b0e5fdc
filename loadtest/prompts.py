"""Prompts for load tests: a TSV file of `id<TAB>text`, in a fixed shuffled order."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROMPTS = REPO_ROOT.parent / "shared" / "data" / "prompts_en.tsv"
SHUFFLE_SEED = 0


class PromptsError(ValueError):
    """The prompts file is missing, empty or malformed (the message names the file and line)."""

    code = "invalid_prompts"


@dataclass(frozen=True, slots=True)
class Prompt:
    id: str
    text: str


def load_prompts(path: str | Path = DEFAULT_PROMPTS) -> list[Prompt]:
    """Read `id<TAB>text` lines (blank lines and lines starting with '#' are skipped), in file order."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PromptsError(f"cannot read the prompts file {path}: {exc.strerror or exc}") from exc
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("#"):
            continue
        prompt_id, tab, text = line.partition("\t")
        if not tab or not prompt_id.strip() or not text.strip():
            raise PromptsError(f"{path}:{number}: expected `id<TAB>text`, got {line[:80]!r}")
        prompts.append(Prompt(prompt_id.strip(), text.strip()))
    if not prompts:
        raise PromptsError(f"{path} holds no prompts")
    return prompts


def fixed_sample(prompts: list[Prompt]) -> list[Prompt]:
    """The prompts in the order every bench run uses: `random.Random(0).shuffle` of the file's order."""
    shuffled = list(prompts)
    random.Random(SHUFFLE_SEED).shuffle(shuffled)
    return shuffled


def prompt_for(sample: list[Prompt], index: int) -> Prompt:
    """Request `index`'s prompt: the sample in order, wrapping around."""
    return sample[index % len(sample)]
