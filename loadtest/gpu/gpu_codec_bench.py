"""Codec decoding per frame at a batch of streams: streaming chunks and whole utterances, against the floor.

- stream_chunk: `CodecDecoder.decode_chunks` of B streams, `chunk_frames` frames each, states advancing
  (a chunk's cost does not depend on the stream's position; the decode service sends 8-frame chunks);
- full: `decode_chunks` of B fresh streams with `full_frames` frames each (one forward, as `decode` does);
- forward: `CodecDecoder.forward` over a prebuilt `StreamBatch` of the chunk (the model alone: no input checks,
  no stacking of states), eager, and replayed as a CUDA graph when it captures (`codec_graph_probe`, run last:
  a failed capture can leave the CUDA context unusable).
Per-frame numbers divide a call by B * frames.
"""

from __future__ import annotations

import torch

from loadtest.gpu.gpu_common import bench_entry, capture_graph, count_flops, floor_ms, tensor_bytes, time_call
from services.model.codec import CodecDecoder
from services.model.codec.stream_state import StreamBatch


def _codes(decoder: CodecDecoder, batch: int, frames: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (frames, decoder.config.num_quantizers)
    return [torch.randint(0, decoder.config.codebook_size, shape, generator=generator).to(decoder.device)
            for _ in range(batch)]


def _per_frame(entry: dict, frames: int) -> dict:
    """Add per-frame medians to an entry's eager (and graph) timings."""
    for key in ("eager", "graph"):
        if key in entry:
            entry[key]["per_frame_ms"] = entry[key]["median_ms"] / frames
    return entry


def _floors(fn, frames: int, weight_bytes: int, ceilings: dict) -> dict:
    floors = floor_ms(weight_bytes, count_flops(fn, 0), ceilings)
    return {**floors, "floor_per_frame_ms": floors["floor_ms"] / frames}


def codec_batch(decoder: CodecDecoder, batch: int, ceilings: dict, opts: dict) -> dict:
    """Eager streaming-chunk, full and model-only decode of `batch` streams."""
    device, chunk, full = decoder.device, opts["chunk_frames"], opts["full_frames"]
    weight_bytes = tensor_bytes(decoder)
    states = [decoder.new_stream() for _ in range(batch)]
    chunk_codes, full_codes = _codes(decoder, batch, chunk, seed=batch), _codes(decoder, batch, full, seed=-batch)

    def stream_chunk() -> list[torch.Tensor]:
        return decoder.decode_chunks(states, chunk_codes)

    def whole() -> list[torch.Tensor]:
        return decoder.decode_chunks([decoder.new_stream() for _ in range(batch)], full_codes)

    stacked = torch.stack(chunk_codes)
    stream_batch = StreamBatch([decoder.new_stream() for _ in range(batch)])

    def forward() -> torch.Tensor:
        return decoder.forward(stacked, stream_batch)

    warmup, reps = opts["codec_warmup"], opts["codec_reps"]
    return {
        "batch": batch, "chunk_frames": chunk, "full_frames": full, "weight_bytes": weight_bytes,
        "stream_chunk": {**_floors(stream_chunk, batch * chunk, weight_bytes, ceilings),
                         **_per_frame(bench_entry(stream_chunk, device, warmup, reps, graph=False), batch * chunk)},
        "full": {**_floors(whole, batch * full, weight_bytes, ceilings),
                 **_per_frame(bench_entry(whole, device, warmup, reps, graph=False), batch * full)},
        "forward": _per_frame(bench_entry(forward, device, warmup, reps, graph=False), batch * chunk),
    }


def codec_graph_probe(decoder: CodecDecoder, batch: int, opts: dict) -> dict:
    """Try to capture `forward` of one chunk over a prebuilt StreamBatch; time its replay when it captures.

    `decode_chunks` itself is not tried: it reads int(codes.min()/max()) per stream (host syncs) and builds
    the StreamBatch from host lists, neither of which a graph can hold.
    """
    device, chunk = decoder.device, opts["chunk_frames"]
    stacked = torch.stack(_codes(decoder, batch, chunk, seed=batch))
    stream_batch = StreamBatch([decoder.new_stream() for _ in range(batch)])
    captured = capture_graph(lambda: decoder.forward(stacked, stream_batch), device)
    result: dict = {"batch": batch, "graph_error": captured.error,
                    "decode_chunks_blockers": "int(codes.min()/max()) per stream; StreamBatch built from host lists"}
    if captured.replay is not None:
        timing = time_call(captured.replay, device, opts["codec_warmup"], opts["codec_reps"])
        result["graph"] = {**timing, "per_frame_ms": timing["median_ms"] / (batch * chunk)}
    return result
