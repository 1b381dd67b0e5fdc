"""Shared pieces of the engine's end-to-end tests: the tiny model, requests, keyed oracle runs, engine runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from services.engine.config import EngineConfig, StageConfig
from services.engine.engine import Engine
from services.engine.launch_listener import LaunchListener
from services.engine.model_ops import ReplayBuilder, replay_rows
from services.engine.outputs import StepOutput
from services.engine.runner import RemotePredictorLike
from services.engine.sequence import RequestOutcome
from services.engine.step_timeline import Record
from services.model import cuda_graph
from services.model.generate import generate
from services.model.loader import TTSModel, load_model
from services.model.prompt import PromptRequest, assistant_text
from services.model.sampling import SamplingParams
from services.model.text_tokenizer import TextTokenizer

TEXTS = (
    "Hello there, this is the first voice speaking a longer sentence for the test.",
    "A second request arrives a little later and speaks about the weather today.",
    "Short one.",
    "The fourth request talks slowly about trains, rivers, mountains and the sea.",
)


def load_tiny(checkpoint: Path) -> tuple[TTSModel, TextTokenizer]:
    return load_model(checkpoint), TextTokenizer.from_dir(checkpoint)


def make_request(tokenizer: TextTokenizer, text: str, speaker: str | None = "ryan", language: str = "english",
                 streaming: bool = True) -> PromptRequest:
    ids = tuple(tokenizer.encode(assistant_text(text)))
    return PromptRequest(ids, speaker=speaker, language=language, non_streaming=not streaming)


def oracle_codes(model: TTSModel, request: PromptRequest, params: SamplingParams, seed: int, max_frames: int,
                 predictor_params: SamplingParams | None = None) -> torch.Tensor:
    """The offline single-request generation (same keyed sampler): codes [frames, 16]."""
    return generate(model, request, max_frames, params, predictor_params or params, seed)


@dataclass
class EngineRun:
    """Everything an engine run returned, by request."""

    codes: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    hidden: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    outcomes: list[RequestOutcome] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    steps: int = 0

    def stacked(self, request_id: str) -> torch.Tensor:
        return torch.stack(self.codes[request_id])

    def hidden_of(self, request_id: str) -> torch.Tensor:
        return torch.stack(self.hidden[request_id])


def new_engine(model: TTSModel, blocks: int, block_size: int = 4, mode: str = "allow",
               replay: ReplayBuilder = replay_rows, *, remote_predictor: RemotePredictorLike | None = None,
               launch_listener: LaunchListener | None = None, step_sink: Record | None = None,
               **limits: int) -> Engine:
    """An engine that captures hidden states, with `limits` overriding EngineConfig fields, and the collaborators
    given (`Engine` says each)."""
    config = EngineConfig(kv_cache_blocks=blocks, block_size=block_size, **{"max_num_seqs": 8, **limits})
    stage = StageConfig("talker", recompute_preemption=mode)
    return Engine(model, config, stage, capture_hidden=True, replay=replay, remote_predictor=remote_predictor,
                  launch_listener=launch_listener, step_sink=step_sink)


def record(run: EngineRun, engine: Engine) -> StepOutput:
    """One step, folded into `run`; returns the step's own output too."""
    out = engine.step()
    run.steps += 1
    for frame in out.frames:
        run.codes.setdefault(frame.request_id, []).append(frame.codes)
        run.hidden.setdefault(frame.request_id, []).append(frame.hidden)
        assert frame.index == len(run.codes[frame.request_id]) - 1
    run.outcomes += out.outcomes
    run.preempted += out.preempted_ids
    return out


def run_to_end(engine: Engine, run: EngineRun | None = None, max_steps: int = 500) -> EngineRun:
    run = run or EngineRun()
    while engine.has_unfinished():
        record(run, engine)
        assert run.steps < max_steps, "the engine did not finish"
    return run


def refuse_captures(monkeypatch) -> list[int]:
    """Every CUDA graph capture raises, as one the driver refuses does; the list records each attempt."""
    attempts: list[int] = []

    def refuse(forward, device, pool):
        attempts.append(1)
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda_graph, "capture", refuse)
    return attempts
