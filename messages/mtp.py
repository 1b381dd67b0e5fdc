"""Messages of later placements: remote code-predictor steps (mtp) and remote-prefill hand-offs.

Both carry the model fingerprint: a step or hand-off made for other weights is refused (`fingerprint_mismatch`).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from messages.base import ErrorInfo, HotMessage, InvalidMessage, Message, NonNegInt, PosInt, ReplicaName
from messages.requests import SynthesisRequest
from messages.voice_clone import ReadyVoice

HiddenDtype = Literal["float32", "float16", "bfloat16"]
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


class StepRequest(HotMessage, tag="mtp_step", kw_only=True, frozen=True):
    """One batched code-predictor step: codebooks 1..15 for B rows. Stateless: any replica can serve it.

    Attributes:
        fingerprint: the model fingerprint the hidden states came from.
        step_id: caller's id, echoed in the reply (resends reuse it).
        num_rows: B.
        hidden_size: H.
        hidden_dtype: element type of `hidden`.
        hidden: talker hidden states [B, H], raw little-endian bytes (bfloat16 as its 16-bit pattern).
        c0: codebook-0 ids [B].
        seeds: request seeds [B].
        frames: frame index of each row [B] (keys the counter-based generator).
        temperature: per row [B]; 0 is greedy.
        top_k: per row [B]; 0 is no top-k.
        top_p: per row [B].
    """

    fingerprint: str
    step_id: NonNegInt
    num_rows: PosInt
    hidden_size: PosInt
    hidden_dtype: HiddenDtype
    hidden: bytes
    c0: list[int]
    seeds: list[int]
    frames: list[int]
    temperature: list[float]
    top_k: list[int]
    top_p: list[float]

    def __post_init__(self) -> None:
        expected = self.num_rows * self.hidden_size * _ITEMSIZE[self.hidden_dtype]
        if len(self.hidden) != expected:
            raise InvalidMessage(f"hidden has {len(self.hidden)} bytes, [{self.num_rows},{self.hidden_size}] "
                                 f"{self.hidden_dtype} needs {expected}")
        for name in ("c0", "seeds", "frames", "temperature", "top_k", "top_p"):
            if len(getattr(self, name)) != self.num_rows:
                raise InvalidMessage(f"{name} has {len(getattr(self, name))} rows, num_rows is {self.num_rows}")


class StepReply(HotMessage, tag="mtp_reply", kw_only=True, frozen=True):
    """Codebooks 1..15 for each row of a StepRequest, or the error; always with the replica's load, so a caller
    can send its next step to the least-loaded replica (a queue group would pick one at random).

    Attributes:
        step_id: the request's step_id; None when the request could not be read at all.
        replica: the replica that answered.
        queued_steps: steps this replica has taken and not yet answered, this one excluded.
        queued_rows: the rows of those steps.
        codes: int16 little-endian [B, 15] (empty on error).
        error: the failure, or None.
    """

    step_id: NonNegInt | None
    replica: ReplicaName
    queued_steps: NonNegInt = 0
    queued_rows: NonNegInt = 0
    codes: bytes = b""
    error: ErrorInfo | None = None

    def __post_init__(self) -> None:
        if self.error is None and (not self.codes or len(self.codes) % 30):
            raise InvalidMessage(f"codes has {len(self.codes)} bytes: not a positive multiple of [.,15] int16")
        if self.error is None and self.step_id is None:
            raise InvalidMessage("a reply with codes must name its step_id")

    def rows(self) -> np.ndarray:
        """The codes as an int64 array [B, 15]."""
        return np.frombuffer(self.codes, dtype="<i2").reshape(-1, 15).astype(np.int64)


class PrefillHandoff(Message, tag="prefill_handoff", kw_only=True, frozen=True):
    """A prefill replica hands a prefilled request to a decode replica; the prompt KV goes by UCX, not NATS.

    Attributes:
        request: the original request (id, seed, sampling...).
        fingerprint: the model fingerprint the KV was computed with.
        prefill_replica: the sender.
        prompt_tokens: prompt positions whose KV is transferred.
        attempt: the prefill's delivery count of the request (a redelivered request is prefilled again: a new
            attempt, whose KV carries another transfer tag).
        transfer: opaque transfer descriptor (UCX address/tag), interpreted by the KV-transfer layer.
        first_frame: the first frame's 16 codes, sampled by the prefill from the prompt's last hidden state.
        voice: a cloned request's voice prompt as the prefill computed it (decode does not compute it again).
    """

    request: SynthesisRequest
    fingerprint: str
    prefill_replica: ReplicaName
    prompt_tokens: PosInt
    attempt: PosInt = 1
    transfer: bytes
    first_frame: list[int]
    voice: ReadyVoice | None = None

    def __post_init__(self) -> None:
        if len(self.first_frame) != 16:
            raise InvalidMessage(f"first_frame has {len(self.first_frame)} codes, a frame has 16")
