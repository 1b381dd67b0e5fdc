"""What a load test offers: the prompts (a TSV file of `id<TAB>text`, in a fixed shuffled order), the request
message for a prompt (voice, language, seed and length mode), and the load levels of a sweep (open-loop arrival
rates and closed-loop concurrencies)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from loadtest.bench.length_mode import describe_realistic, realistic_frames
from loadtest.bench.reference_voice import PayloadError, ReferenceVoice

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PROMPTS = REPO_ROOT.parent / "shared" / "data" / "prompts_en.tsv"
SHUFFLE_SEED = 0
Mode = Literal["open", "closed"]
MODES: tuple[Mode, ...] = ("open", "closed")
DEFAULT_RATES = (0.5, 1.0, 2.0, 4.0)
DEFAULT_CONCURRENCIES = (1, 8, 32, 64)
DEFAULT_OPEN_REQUESTS = 32
MIN_CLOSED_REQUESTS = 16


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


@dataclass(frozen=True, slots=True)
class RequestShape:
    """Everything in a request except the text.

    Attributes:
        voice: speaker name; None leaves it out (voice_design and base checkpoints have none).
        language: "auto" or a language of the checkpoint.
        model: the model name; None asks for the gateway's served model.
        fixed_frames: fixed-length mode: `ignore_eos` with `max_new_tokens` = this many codec frames (12.5 per
            second of audio), so random-weight checkpoints, which rarely emit EOS, make requests of known length.
        initial_chunk_frames: frames in the first chunk; None uses the mesh's default.
        temperature: talker sampling temperature; None uses the checkpoint's default.
        seed: request i gets seed + i, so reruns make the same audio.
        reference: a cloned voice's reference audio sent with every request (base checkpoints), or None.
        realistic_length: realistic-length mode: each request's frames from its text (length_mode.py).
        response_format: the audio's format (HTTP's `response_format`; the socket's `format` for pcm, ulaw, alaw),
            decoded by the bench as it streams when not pcm.
        sample_rate: the audio's rate, sent as `sample_rate`; None asks for the format's own.
    """

    voice: str | None = "ryan"
    language: str = "auto"
    model: str | None = None
    fixed_frames: int | None = None
    initial_chunk_frames: int | None = None
    temperature: float | None = None
    seed: int = 0
    reference: ReferenceVoice | None = None
    realistic_length: bool = False
    response_format: str = "pcm"
    sample_rate: int | None = None

    def __post_init__(self) -> None:
        if self.realistic_length and self.fixed_frames is not None:
            raise PayloadError("choose one length mode: fixed frames or realistic length, not both")
        if self.sample_rate is not None and self.sample_rate <= 0:
            raise PayloadError(f"sample_rate must be a positive number of Hz, got {self.sample_rate}")
        for name in ("fixed_frames", "initial_chunk_frames"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise PayloadError(f"{name} must be a positive number of frames, got {value}")

    @property
    def length_mode(self) -> str:
        """`fixed` (ignore_eos + max_new_tokens), `realistic` (frames from the text) or `natural` (until EOS)."""
        if self.realistic_length:
            return "realistic"
        return "natural" if self.fixed_frames is None else "fixed"

    def describe_length(self) -> str:
        if self.realistic_length:
            return describe_realistic()
        if self.fixed_frames is None:
            return "natural length (until EOS)"
        return f"fixed length: ignore_eos, max_new_tokens={self.fixed_frames} frames"

    def payload(self, text: str, index: int) -> dict:
        """The JSON message for request `index` saying `text`."""
        body: dict = {"input": text, "language": self.language, "seed": self.seed + index}
        optional = {"voice": self.voice, "model": self.model, "initial_chunk_frames": self.initial_chunk_frames,
                    "temperature": self.temperature, "sample_rate": self.sample_rate}
        body.update({key: value for key, value in optional.items() if value is not None})
        if self.fixed_frames is not None:
            body.update(ignore_eos=True, max_new_tokens=self.fixed_frames)
        if self.realistic_length:
            frames = realistic_frames(text)
            body.update(min_new_tokens=frames, max_new_tokens=frames)
        if self.reference is not None:
            body.update(self.reference.fields())
        return body

    def to_dict(self) -> dict:
        return {"voice": self.voice, "language": self.language, "model": self.model,
                "length_mode": self.length_mode, "length": self.describe_length(), "fixed_frames": self.fixed_frames,
                "initial_chunk_frames": self.initial_chunk_frames, "temperature": self.temperature,
                "seed": self.seed, "reference": None if self.reference is None else self.reference.to_dict(),
                "response_format": self.response_format, "sample_rate": self.sample_rate}


class LoadError(ValueError):
    """A load level that cannot run (non-positive rate, concurrency, count or time limit)."""

    code = "invalid_load"


@dataclass(frozen=True, slots=True)
class Level:
    """One load level.

    Attributes:
        mode: "open" (Poisson arrivals) or "closed" (fixed concurrency).
        load: arrivals per second (open) or concurrent clients (closed).
        num_requests: requests to send at this level.
    """

    mode: Mode
    load: float
    num_requests: int

    @property
    def name(self) -> str:
        return f"open {self.load:g}/s" if self.mode == "open" else f"closed x{self.load:g}"

    def to_dict(self) -> dict:
        return {"mode": self.mode, "load": self.load, "load_unit": "requests/s" if self.mode == "open" else "clients",
                "num_requests": self.num_requests}


def plan_levels(modes: Sequence[Mode], *, rates: Sequence[float] = DEFAULT_RATES,
                concurrencies: Sequence[int] = DEFAULT_CONCURRENCIES, num_requests: int | None = None) -> list[Level]:
    """Open-loop levels first (ascending rate), then closed-loop (ascending concurrency).

    Without `num_requests`, an open level sends DEFAULT_OPEN_REQUESTS and a closed level twice its concurrency
    (at least MIN_CLOSED_REQUESTS), so every client sends more than one request.
    """
    if num_requests is not None and num_requests <= 0:
        raise LoadError(f"the number of requests per level must be positive, got {num_requests}")
    levels: list[Level] = []
    if "open" in modes:
        for rate in sorted(rates):
            if not rate > 0:
                raise LoadError(f"arrival rates must be positive, got {rate}")
            levels.append(Level("open", float(rate), num_requests or DEFAULT_OPEN_REQUESTS))
    if "closed" in modes:
        for concurrency in sorted(concurrencies):
            if concurrency <= 0:
                raise LoadError(f"concurrencies must be positive, got {concurrency}")
            levels.append(Level("closed", concurrency, num_requests or max(MIN_CLOSED_REQUESTS, 2 * concurrency)))
    if not levels:
        raise LoadError("no load levels: give --mode open/closed/both with at least one rate or concurrency")
    return levels
