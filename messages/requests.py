"""What the gateway puts on REQUESTS, and the core-NATS control requests around a request."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from messages.base import Message, NonNegInt, PosInt, RequestId, Seed, UnixTime
from messages.voice_clone import VoiceClone

MAX_TEXT_CHARS = 4096  # like OpenAI's speech endpoint (DESIGN.md invariant 7)

Text = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT_CHARS)]
Temperature = Annotated[float, msgspec.Meta(ge=0)]
TopP = Annotated[float, msgspec.Meta(gt=0, le=1)]
Penalty = Annotated[float, msgspec.Meta(gt=0)]
# A tenant is the name of the API key a request came with ("" when the mesh has no keys or the key has no name):
# a subject-token-safe name, so limits, fair share and usage can key on it.
TenantName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{0,64}$")]
Priority = Literal["interactive", "batch"]


class SamplingSpec(msgspec.Struct, kw_only=True, frozen=True):
    """Sampling settings as the client asked; None means the checkpoint's generation_config default.

    Attributes:
        temperature: 0 means greedy.
        top_k: keep the k most likely ids (0: no top-k).
        top_p: nucleus mass in (0, 1].
        repetition_penalty: on previously generated codebook-0 ids (talker only).
    """

    temperature: Temperature | None = None
    top_k: NonNegInt | None = None
    top_p: TopP | None = None
    repetition_penalty: Penalty | None = None


class SynthesisRequest(Message, tag="synthesis_request", kw_only=True, frozen=True):
    """One text to speak, admitted by the gateway onto `tts.req.<model>`.

    Attributes:
        id: request id, a subject token; every other message of the request names it.
        model: model name as served (slugged for subjects).
        text: 1..4096 characters.
        speaker: a speaker of the checkpoint's `spk_id` (custom_voice), or None.
        language: "auto" or a name from the checkpoint's `codec_language_id`.
        instruct: style instruction (voice_design; ignored by 0.6B custom_voice), or None.
        text_mode: "non-streaming" (whole text in the prefill) or "streaming" (text fed along the frames).
        seed: the generator seed; fixed at admission so replays, migrations and redeliveries reproduce the audio.
        sampling: talker sampling.
        subtalker_sampling: code-predictor sampling; None uses `sampling`'s temperature/top_k and the defaults.
        max_new_tokens: cap on frames; None leaves only the runaway guard (proportional to the text).
        ignore_eos: keep generating past EOS up to the cap (benchmarks).
        initial_chunk_frames: frames in the first codes chunk (low first-packet latency); None: service default.
        deadline: unix time after which a still-queued request fails with `timeout`; None: no deadline.
        created_at: unix time of admission.
        min_new_tokens: frames to generate before EOS may end the request; None: the model's minimum.
        clone: the cloned voice of a base model's request (reference audio or a saved voice); None otherwise.
        tenant: the name of the API key the request came with ("" for the anonymous tenant).
        priority: "interactive" (admitted first, with seats kept for it) or "batch".
    """

    id: RequestId
    model: str
    text: Text
    speaker: str | None = None
    language: str = "auto"
    instruct: str | None = None
    text_mode: Literal["non-streaming", "streaming"] = "non-streaming"
    seed: Seed = 0
    sampling: SamplingSpec = SamplingSpec()
    subtalker_sampling: SamplingSpec | None = None
    max_new_tokens: PosInt | None = None
    ignore_eos: bool = False
    initial_chunk_frames: PosInt | None = None
    deadline: UnixTime | None = None
    created_at: UnixTime = 0.0
    min_new_tokens: NonNegInt | None = None  # appended last: older readers skip it
    clone: VoiceClone | None = None  # appended last: older readers skip it
    tenant: TenantName = ""  # appended last: older readers skip it
    priority: Priority = "interactive"  # appended last: older readers skip it


class RedecodeRequest(Message, tag="redecode_request", kw_only=True, frozen=True):
    """Core NATS request to a partition's vocoder: publish a request's audio again from CODES.

    Attributes:
        request_id: the request.
        from_seq: first audio chunk sequence wanted; earlier chunks are not re-sent.
    """

    request_id: RequestId
    from_seq: NonNegInt = 0


class RedecodeReply(Message, tag="redecode_reply", kw_only=True, frozen=True):
    """The vocoder's answer to a RedecodeRequest.

    Attributes:
        request_id: the request.
        accepted: True when the chunks from `from_seq` on will be published on `tts.audio.<id>`.
        reason: why not, when not accepted.
    """

    request_id: RequestId
    accepted: bool
    reason: str | None = None
