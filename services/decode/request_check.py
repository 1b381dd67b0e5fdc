"""From a SynthesisRequest to what the engine takes: checked against the served checkpoint, tokenized, budgeted.

The checks here need no weights (config.json and the tokenizer), so a bad request is refused before any torch work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from messages import subjects
from messages.errors import ErrorCode
from messages.requests import SamplingSpec, SynthesisRequest
from services.decode.settings import DecodeSettings
from services.model.config import GenerationDefaults, TTSConfig
from services.model.errors import RequestError
from services.model.prompt import ROLE_TOKENS, TAIL_TOKENS, PromptRequest, assistant_text, codec_prefix, instruct_text
from services.model.sampling import SamplingParams, SamplingParamsError
from services.model.text_tokenizer import TextTokenizer


class RequestRefused(ValueError):
    """A request this replica refuses to serve as asked (checked against its checkpoint, or its voice); `code` is the
    ErrorCode its CodesEnd carries. The gateway's `AdmissionError` is the gateway's own refusal, before the bus."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Admission:
    """A request ready for `Engine.add_request` (as an `EngineRequest`), with the counts its usage reports."""

    request: SynthesisRequest
    prompt: PromptRequest
    params: SamplingParams
    """How the talker samples codebook 0."""
    predictor_params: SamplingParams
    """How the code predictor samples codebooks 1..15."""
    max_new_frames: int
    input_tokens: int

    @property
    def request_id(self) -> str:
        return self.request.id


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What admission needs to know about the checkpoint this replica serves (no weights)."""

    name: str
    config: TTSConfig
    generation: GenerationDefaults
    tokenizer: TextTokenizer


def admit(request: SynthesisRequest, model: ServedModel, settings: DecodeSettings) -> Admission:
    """Check and translate one request. Raises RequestRefused (unknown_model for a request of another model,
    invalid_request naming what is wrong, or timeout when it waited on REQUESTS past its deadline). A cloned voice's
    prompt is attached later, off this path (`VoicePrompts.attach`): here only whether the model clones at all is
    checked."""
    if not subjects.same_model(request.model, model.name):
        # Put on this model's subject by something other than a gateway of this model (a gateway refuses another
        # model up front): serving it with these weights would answer in the wrong voice, or not at all.
        raise RequestRefused(ErrorCode.UNKNOWN_MODEL, f"this request asks for model {request.model!r}, which no "
                             f"replica on this subject serves (it serves {model.name!r}); send it to a gateway "
                             "of that model")
    if request.deadline is not None and time.time() > request.deadline:
        raise RequestRefused(ErrorCode.TIMEOUT, "the request waited in the queue past its deadline; the mesh is "
                             "overloaded: retry later, or add decode replicas")
    try:
        codec_prefix(model.config, request.speaker, request.language)  # unknown speaker/language raise here
    except RequestError as exc:
        raise RequestRefused(ErrorCode.INVALID_REQUEST, exc.message) from exc
    is_base = model.config.tts_model_type == "base"
    if is_base and request.clone is None:
        raise RequestRefused(ErrorCode.VOICE_REQUIRED, "this replica serves a base (voice-cloning) checkpoint: give "
                             "reference audio (ref_audio, and ref_text unless x_vector_only_mode) or a saved voice")
    if not is_base and request.clone is not None:
        raise RequestRefused(ErrorCode.VOICE_CLONING_UNSUPPORTED, f"this replica serves a "
                             f"{model.config.tts_model_type} checkpoint, which cannot clone a voice")
    text_ids = tuple(model.tokenizer.encode(assistant_text(request.text)))
    input_tokens = len(text_ids) - ROLE_TOKENS - TAIL_TOKENS
    if input_tokens <= 0:
        raise RequestRefused(ErrorCode.INVALID_REQUEST, "the text tokenizes to nothing: give at least one word")
    instruct_ids = tuple(model.tokenizer.encode(instruct_text(request.instruct))) if request.instruct else None
    prompt = PromptRequest(text_ids=text_ids, instruct_ids=instruct_ids, speaker=request.speaker,
                           language=request.language, non_streaming=request.text_mode == "non-streaming")
    budget = settings.frame_budget(len(request.text), request.max_new_tokens)
    talker = sampling_params(request.sampling, model.generation)
    predictor = predictor_sampling_params(request.subtalker_sampling, talker, model.generation)
    return Admission(request, prompt, talker, predictor, budget, input_tokens)


def sampling_params(spec: SamplingSpec, defaults: GenerationDefaults) -> SamplingParams:
    """The request's talker sampling, each unset field taken from the checkpoint's generation_config."""
    fallback = SamplingParams(temperature=defaults.temperature if defaults.do_sample else 0.0, top_k=defaults.top_k,
                              top_p=defaults.top_p, repetition_penalty=defaults.repetition_penalty)
    return _merged(spec, fallback, "sampling")


def predictor_sampling_params(spec: SamplingSpec | None, talker: SamplingParams,
                              defaults: GenerationDefaults) -> SamplingParams:
    """The code predictor's sampling: the request's `subtalker_sampling`, each unset field from the checkpoint's
    `subtalker_*` settings (as `voxmesh synth` does). A greedy talker with no subtalker settings makes the
    predictor greedy too: a client that asked for temperature 0 wants the same audio every time. No repetition
    penalty: the reference penalises codebook 0 only."""
    greedy = spec is None and talker.temperature == 0
    sampled = defaults.subtalker_dosample and not greedy
    fallback = SamplingParams(temperature=defaults.subtalker_temperature if sampled else 0.0,
                              top_k=defaults.subtalker_top_k, top_p=defaults.subtalker_top_p, repetition_penalty=1.0)
    return _merged(spec or SamplingSpec(repetition_penalty=1.0), fallback, "subtalker sampling")


def _merged(spec: SamplingSpec, fallback: SamplingParams, what: str) -> SamplingParams:
    """`spec`'s fields where set, `fallback`'s elsewhere; an out-of-range result is the request's error."""
    try:
        return SamplingParams(
            temperature=float(fallback.temperature if spec.temperature is None else spec.temperature),
            top_k=fallback.top_k if spec.top_k is None else spec.top_k,
            top_p=float(fallback.top_p if spec.top_p is None else spec.top_p),
            repetition_penalty=float(fallback.repetition_penalty if spec.repetition_penalty is None
                                     else spec.repetition_penalty),
        )
    except SamplingParamsError as exc:
        raise RequestRefused(ErrorCode.INVALID_REQUEST, f"{what}: {exc}") from exc
