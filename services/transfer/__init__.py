"""KV transfer over UCX (ucxx): a prefill replica offers a tensor, a decode replica fetches it into its buffer.

- `agent.KvTransferAgent`: one per process (`start`, `offer`, `fetch`, `close`); importing it imports ucxx.
- `descriptor.describe(bytes) -> TransferDescriptor`: read a descriptor (TransferFailed `malformed` when it is not one).
- `errors.TransferFailed`: the typed error, `code` a `messages.errors.TransferCode`.
- `tags.tag_of(request_id, attempt)`: the UCX tag of an offer.

Nothing is imported here, so a process that never moves KV (decode in `single`, on a laptop install without the `ucx`
extra) never needs ucxx.
"""
