"""KV transfer over UCX (ucxx): a prefill replica offers a tensor, a decode replica fetches it into its buffer.

- `KvTransferAgent`: one per process (`start`, `offer`, `fetch`, `close`).
- `describe(bytes) -> TransferDescriptor`: read a descriptor (TransferFailed `malformed` when it is not one).
- `TransferFailed`: the typed error, `code` a `messages.errors.TransferCode`.
- `tag_of(request_id, attempt)`: the UCX tag of an offer.
"""

from services.transfer.agent import KvTransferAgent
from services.transfer.descriptor import describe
from services.transfer.errors import TransferFailed
from services.transfer.tags import tag_of

__all__ = ["KvTransferAgent", "TransferFailed", "describe", "tag_of"]
