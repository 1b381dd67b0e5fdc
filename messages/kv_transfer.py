"""Messages of the KV transfer (services.transfer): the descriptor of an offered tensor, and the NATS request/reply by
which a decode replica asks the offering replica to send it over UCX. The tensor itself never travels on NATS.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from messages.base import InvalidMessage, Message, NonNegInt, PosInt, ReplicaName, RequestId
from messages.errors import TransferCode

# A UCX tag: 63 of its 64 bits (msgspec's bounds fit an int64), derived from (request id, attempt), so a stale
# attempt never matches a newer one.
UcxTag = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
# A UCX worker address (opaque bytes from UCX); a TCP worker's is a few hundred bytes.
WorkerAddress = Annotated[bytes, msgspec.Meta(min_length=1, max_length=65536)]
TensorDtype = Literal["float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"]
ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
                            "int8": 1, "uint8": 1, "bool": 1}


class TransferDescriptor(Message, tag="kv_transfer", kw_only=True, frozen=True):
    """Where an offered tensor waits and what it is: what `PrefillHandoff.transfer` carries (encoded).

    Attributes:
        replica: the offering replica; it answers on `subjects.kv_transfer(replica)`.
        worker_address: the offering process's UCX worker address.
        request_id: the request whose KV this is.
        attempt: the hand-off attempt (a retry offers again under a new tag).
        tag: the UCX tag the data is sent with (`services.transfer.tags.tag_of(request_id, attempt)`).
        nbytes: the tensor's size in bytes.
        dtype: its element type.
        shape: its shape (contiguous, row-major).
    """

    replica: ReplicaName
    worker_address: WorkerAddress
    request_id: RequestId
    attempt: NonNegInt
    tag: UcxTag
    nbytes: PosInt
    dtype: TensorDtype
    shape: list[NonNegInt]

    def __post_init__(self) -> None:
        elements = 1
        for size in self.shape:
            elements *= size
        if elements * ITEMSIZE[self.dtype] != self.nbytes:
            raise InvalidMessage(f"shape {self.shape} of {self.dtype} is {elements * ITEMSIZE[self.dtype]} bytes, "
                                 f"the descriptor says {self.nbytes}")


class FetchRequest(Message, tag="kv_fetch", kw_only=True, frozen=True):
    """A decode replica asks the offering replica to send an offered tensor (core NATS request).

    Attributes:
        tag: the offer's UCX tag (from its descriptor).
        nbytes: the bytes the asker will receive; a different size is refused (`mismatch`).
        worker_address: the asker's UCX worker address: where to send it.
    """

    tag: UcxTag
    nbytes: PosInt
    worker_address: WorkerAddress


class FetchReply(Message, tag="kv_fetch_reply", kw_only=True, frozen=True):
    """The offering replica's answer: the send has started (`refusal` None), or why it will not send.

    Attributes:
        refusal: None when the tagged send is under way; `unknown` (no such offer: expired, already fetched,
            restarted) or `mismatch` (the asked size differs from the offer's).
        message: for a person, when refused.
    """

    refusal: TransferCode | None = None
    message: str = ""
