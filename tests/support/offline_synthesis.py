"""The offline oracle the mesh must equal: `voxmesh synth`'s codes, made in the test's own process.

`voxmesh synth` loads the checkpoint and calls the model's `generate` with the request's prompt, sampling and seed
(greedy: seed 0); this calls the same functions with the same arguments (float32 on the CPU, the text in
non-streaming mode, language auto), so a mesh test compares with exactly what the command would have written, without
starting a process and loading the model for every answer. Each checkpoint is loaded once a process and each answer
kept (read-only). The command itself, its flags and its WAV, is tested in tests/mesh/test_synth_cli.py.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from services.model.generate import default_sampling, generate
from services.model.loader import load_model
from services.model.prompt import make_request
from services.model.text_tokenizer import TextTokenizer

DEFAULT_FRAMES = 24


@functools.lru_cache(maxsize=4)
def _loaded(checkpoint: Path):
    return load_model(checkpoint), TextTokenizer.from_dir(checkpoint)


@functools.lru_cache(maxsize=256)
def _codes(checkpoint: Path, text: str, speaker: str, seed: int | None, frames: int, ignore_eos: bool) -> np.ndarray:
    model, tokenizer = _loaded(checkpoint)
    request = make_request(tokenizer, text, speaker=speaker, language="auto", non_streaming=True)
    codes = generate(model, request, frames, *default_sampling(model.generation, seed is None), seed=seed or 0,
                     ignore_eos=ignore_eos).numpy().astype(np.int64)
    codes.setflags(write=False)  # shared by every caller that asks for the same codes
    return codes


def synth_codes(checkpoint: Path, text: str, voice: str = "vivian", seed: int | None = None,
                frames: int = DEFAULT_FRAMES, ignore_eos: bool = False) -> np.ndarray:
    """The codes of `voxmesh synth --model CHECKPOINT --text TEXT --speaker VOICE --max-new-tokens FRAMES` with
    `--greedy` (seed None) or `--seed SEED`, and `--ignore-eos` where asked: (frames, 16) int64."""
    return _codes(Path(checkpoint), text, voice, seed, frames, ignore_eos)
