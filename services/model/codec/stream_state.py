"""Per-request streaming state of the codec decoder, and its batched form for one forward call.

Everything the decoder needs from the past is bounded: each causal convolution looks back
`(kernel - 1) * dilation` input samples, each transposed convolution `ceil(kernel / stride) - 1`
input samples, and each transformer layer attends to the previous `sliding_window - 1`
frames. So a request's state is a fixed set of fixed-size tensors, and a chunk's work
depends only on the chunk, never on how many frames came before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from services.model.codec.errors import CodecInputError


@dataclass(frozen=True, slots=True)
class StreamLayout:
    """Shapes of one request's state, fixed by the decoder's architecture."""

    conv_history_shapes: tuple[tuple[int, int], ...]
    """(channels, samples) of each streaming convolution's input history, in slot order."""
    num_layers: int
    num_kv_heads: int
    window: int
    """Frames of keys/values kept per layer: `sliding_window - 1` (the current frame is new)."""
    head_dim: int

    @property
    def kv_shape(self) -> tuple[int, int, int]:
        return (self.num_kv_heads, self.window, self.head_dim)


class CodecStreamState:
    """One request's decoder state: conv input histories and per-layer K/V windows.

    Create it with `CodecDecoder.new_stream()`; pass it to `decode_chunk` / `decode_chunks`,
    which update it in place. Its tensors keep the same shapes (and bytes) for the whole stream.
    """

    __slots__ = ("layout", "num_frames", "conv_histories", "keys", "values")

    def __init__(self, layout: StreamLayout, device: torch.device, dtype: torch.dtype) -> None:
        self.layout = layout
        self.num_frames = 0  # frames decoded so far = the RoPE position of the next frame
        # Zero history is exactly the zero padding a full decode applies at the start.
        self.conv_histories = [torch.zeros(shape, device=device, dtype=dtype) for shape in layout.conv_history_shapes]
        self.keys = [torch.zeros(layout.kv_shape, device=device, dtype=dtype) for _ in range(layout.num_layers)]
        self.values = [torch.zeros(layout.kv_shape, device=device, dtype=dtype) for _ in range(layout.num_layers)]

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the state (for size accounting and moving)."""
        return [*self.conv_histories, *self.keys, *self.values]

    def num_bytes(self) -> int:
        """Bytes the state holds; constant over the life of a stream."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def shapes(self) -> list[tuple[int, ...]]:
        """Shapes of every tensor of the state; constant over the life of a stream."""
        return [tuple(t.shape) for t in self.tensors()]


class StreamRows(Protocol):
    """What the decoder's modules read and replace during one forward: B streams' states as batched tensors.

    Modules read `conv_histories[slot]` / `keys[layer]` / `values[layer]` (leading dim B) and `positions`
    ([B] frames decoded so far), and hand back what the next chunk needs through `keep_history` and `keep_window`.
    """

    positions: torch.Tensor
    conv_histories: list[torch.Tensor]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def keep_history(self, slot: int, full: torch.Tensor, history: int) -> None:
        """Keep conv history `slot`: of `full` ([B, C, history + n]: the stored history, then this chunk's inputs),
        the `history` entries that end where each row's own frames end."""
        ...

    def keep_window(self, layer: int, keys: torch.Tensor, values: torch.Tensor, window: int) -> None:
        """Keep `layer`'s K/V window: of `keys` and `values` ([B, heads, window + n, head_dim]), the `window` entries
        that end where each row's own frames end."""
        ...


class StreamBatch:
    """The states of B requests stacked on a leading batch dim, read and replaced by one forward.

    Modules read `conv_histories[slot]` / `keys[layer]` and assign the updated tensors back;
    `scatter()` then hands each request its row.
    """

    def __init__(self, states: list[CodecStreamState]) -> None:
        device = states[0].keys[0].device
        self.positions = torch.tensor([s.num_frames for s in states], dtype=torch.long, device=device)
        self.conv_histories = [_stack([s.conv_histories[i] for s in states]) for i in range(len(states[0].conv_histories))]
        self.keys = [_stack([s.keys[i] for s in states]) for i in range(len(states[0].keys))]
        self.values = [_stack([s.values[i] for s in states]) for i in range(len(states[0].values))]

    def keep_history(self, slot: int, full: torch.Tensor, history: int) -> None:
        self.conv_histories[slot] = _tail(full, history)

    def keep_window(self, layer: int, keys: torch.Tensor, values: torch.Tensor, window: int) -> None:
        self.keys[layer], self.values[layer] = _tail(keys, window), _tail(values, window)

    def scatter(self, states: list[CodecStreamState], num_new_frames: int) -> None:
        """Give each state its row of the updated tensors and advance its frame count."""
        for row, state in enumerate(states):
            state.conv_histories = [t[row] for t in self.conv_histories]
            state.keys = [t[row] for t in self.keys]
            state.values = [t[row] for t in self.values]
            state.num_frames += num_new_frames


def _tail(full: torch.Tensor, history: int) -> torch.Tensor:
    # Every row of a batch here has the chunk's length, so the tails end where `full` does. A copy: the state outlives
    # the call, and a view would pin the whole chunk's activations.
    return full[:, :, full.shape[2] - history:].clone()


def _stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    # One request (the common streaming case) needs no copy.
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(tensors)


def check_states(states: list[CodecStreamState], layout: StreamLayout) -> None:
    """Refuse states that another decoder (another layout) created."""
    for state in states:
        if not isinstance(state, CodecStreamState) or state.layout != layout:
            raise CodecInputError(
                "foreign_state", "stream state was not created by this decoder's new_stream()"
            )
