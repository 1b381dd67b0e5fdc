"""One talker decode step and one code-predictor frame at a batch size, timed against their floors.

The talker step is `Talker.forward` over the paged pool: B sequences of `context` cached tokens each (blocks
scattered over the pool, as an engine leaves them) plus one new token each. `Talker.forward` itself cannot be
captured in a CUDA graph (see `TALKER_CAPTURE_BLOCKERS`), so its graph number comes from a decode-only variant
that builds the layout before capture and gathers the valid rows by a precomputed index: the same math
(checked against the eager forward before timing), which is what a graph runner over bucketed batch shapes
would replay. The code-predictor frame is `CodePredictor.predict` (15 sequential steps), greedy and with the
engine's keyed sampler, eager and captured as it stands.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from loadtest.gpu.gpu_common import bench_entry, count_flops, floor_ms, tensor_bytes
from services.model.attention_batch import AttentionBatch
from services.model.loader import TTSModel
from services.model.paged_attention import PagedLayout, write_kv
from services.model.sampling import RowSampling, SamplingParams, sample

BLOCK_SIZE = 16
TALKER_CAPTURE_BLOCKERS = (
    "PagedLayout.of reads int(max()) of the query counts and sequence lengths (host syncs);"
    " reference_kernel selects rows with a boolean mask (nonzero, a host sync)"
)


def decode_batch(batch: int, context: int, num_blocks: int, device: torch.device, seed: int) -> AttentionBatch:
    """B decode rows, each with `context` cached tokens, in blocks drawn at random from the pool."""
    per_seq = -(-(context + 1) // BLOCK_SIZE)
    generator = torch.Generator().manual_seed(seed)
    tables = torch.randperm(num_blocks, generator=generator)[: batch * per_seq].view(batch, per_seq)
    position = torch.full((batch,), context, dtype=torch.int64)
    slots = tables[:, context // BLOCK_SIZE] * BLOCK_SIZE + context % BLOCK_SIZE
    return AttentionBatch(
        positions=position.to(device), slot_mapping=slots.to(device),
        query_start=torch.arange(batch + 1, dtype=torch.int64).to(device),
        seq_lens=(position + 1).to(device), block_tables=tables.to(device),
    )


class DecodeOnlyAttention:
    """`PagedAttention` for batches of one new token per sequence, with no host sync inside a call.

    Same steps as `paged_attention.reference_kernel` (write K/V, gather the block columns, zero stale slots,
    masked SDPA); the one new row per sequence is taken by position instead of by a boolean mask.
    """

    def __init__(self, pool: torch.Tensor, batch: AttentionBatch, scale: float) -> None:
        self.pool, self.slot_mapping, self.scale = pool, batch.slot_mapping, scale
        self.layout = PagedLayout.of(batch, block_size=pool.shape[3])

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        write_kv(self.pool, layer, self.slot_mapping, k, v)
        layout, pool = self.layout, self.pool
        rows, columns = layout.tables.shape
        kv = pool[layout.tables, layer]
        kv = kv.transpose(2, 3).reshape(rows, columns * pool.shape[3], 2, *pool.shape[-2:]).permute(0, 2, 3, 1, 4)
        keys = kv[:, 0].masked_fill(layout.stale, 0).to(q.dtype)
        values = kv[:, 1].masked_fill(layout.stale, 0).to(q.dtype)
        out = F.scaled_dot_product_attention(
            q[:, None].transpose(1, 2), keys, values, attn_mask=layout.visible, scale=self.scale,
            enable_gqa=keys.shape[1] != q.shape[1],
        )
        return out.transpose(1, 2)[:, 0]


def kv_bytes_read(model: TTSModel, batch: int, context: int, element_size: int) -> int:
    """K and V of every cached token of every sequence, all layers: what attention must read at least."""
    d = model.config.talker.decoder
    return batch * (context + 1) * d.num_layers * 2 * d.num_kv_heads * d.head_dim * element_size


def talker_step(model: TTSModel, batch: int, context: int, ceilings: dict, opts: dict) -> dict:
    """Eager `Talker.forward` and the graph-replayed decode-only variant for one decode step of `batch` rows."""
    device, talker = model.device, model.talker
    per_seq = -(-(context + 1) // BLOCK_SIZE)
    num_blocks = batch * per_seq + 8
    pool = torch.randn(talker.kv_pool_shape(num_blocks, BLOCK_SIZE), device=device, dtype=model.dtype)
    attention_batch = decode_batch(batch, context, num_blocks, device, seed=batch)
    embeds = torch.randn(batch, talker.hidden_size, device=device, dtype=model.dtype)
    scale = model.config.talker.decoder.head_dim**-0.5
    attend = DecodeOnlyAttention(pool, attention_batch, scale)

    def eager() -> torch.Tensor:
        return talker.forward(embeds, attention_batch, pool)

    def decode_only() -> torch.Tensor:
        return talker.model(embeds, attention_batch.positions, attend)

    reference, variant = eager().float(), decode_only().float()
    weight_bytes = tensor_bytes(talker.model)
    bytes_read = weight_bytes + kv_bytes_read(model, batch, context, pool.element_size())
    entry = bench_entry(eager, device, opts["warmup"], opts["reps"], graph=False)
    entry["graph_error"] = f"Talker.forward as written: {TALKER_CAPTURE_BLOCKERS}"
    variant_entry = bench_entry(decode_only, device, opts["warmup"], opts["reps"], graph=True)
    return {
        "batch": batch, "context_tokens": context, "weight_bytes": weight_bytes, "bytes_read": bytes_read,
        **floor_ms(bytes_read, count_flops(eager, 2 * batch * weight_bytes // pool.element_size()), ceilings),
        "weights_only_floor_ms": 1000 * weight_bytes / ceilings["copy_bandwidth_bytes_per_s"],
        "forward": entry,
        "decode_only_variant": variant_entry,
        "variant_rel_error": float((variant - reference).norm() / reference.norm().clamp_min(1e-30)),
    }


def predictor_bytes(model: TTSModel) -> int:
    """Weights one frame reads: the decoder stack and projection 15 times, each codebook's head once."""
    predictor = model.code_predictor
    steps = predictor.cfg.num_code_groups - 1
    per_step = tensor_bytes(predictor.model) + tensor_bytes(predictor.small_to_mtp_projection)
    return steps * per_step + tensor_bytes(predictor.lm_head)


def predictor_frame(model: TTSModel, batch: int, ceilings: dict, opts: dict) -> dict:
    """`CodePredictor.predict` for `batch` rows: greedy and with the engine's sampler, eager and as a graph."""
    device, predictor = model.device, model.code_predictor
    hidden = torch.randn(batch, model.talker.hidden_size, device=device, dtype=model.dtype)
    first = torch.randint(0, 2048, (batch,), device=device)
    rows = RowSampling.build([SamplingParams()] * batch, list(range(batch)), [3] * batch, device=device)

    def greedy() -> torch.Tensor:
        return predictor.predict(hidden, first)

    def sampled() -> torch.Tensor:
        return predictor.predict(hidden, first, lambda logits, codebook: sample(logits, rows, codebook))

    bytes_read = predictor_bytes(model)
    return {
        "batch": batch, "weight_bytes": bytes_read, "bytes_read": bytes_read,
        # Estimate: two FLOPs per weight per row (the first of the 15 steps has two rows; attention is tiny).
        **floor_ms(bytes_read, count_flops(greedy, 2 * batch * bytes_read // hidden.element_size()), ceilings),
        "greedy": bench_entry(greedy, device, opts["warmup"], opts["reps"], graph=True),
        "sampled": bench_entry(sampled, device, opts["warmup"], opts["reps"], graph=True),
    }
