"""What a fresh process pays the first time its eager prompt path meets a row count (issue 41's fresh meshes).

Decode builds each request's prompt rows eagerly (`services/model/prompt.py`): an upload of the ids, the text
embedding and the talker's `TextProjection` over the request's token count, through cuBLAS, whose kernel for a GEMM
depends on its row count. This times those ops at every row count from 1 to `--max-rows`, ascending, twice in one
process, the upload and lookup apart from the projection: a first-sweep cost well above the second's is a first use
(a kernel loaded, a heuristic computed). It also times a pinned host block's allocation at each size class, first
and again. Run once as is and once with CUDA_MODULE_LOADING=EAGER (every kernel loaded at start): spikes that go
away there are lazy kernel loading. RESULTS-GPU's tenth-session section says what it is for.

    python3 -m experiments.first_use_shapes --out F.json [--max-rows 160] [--text-hidden 2048 --hidden 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from services.model.layers import TextProjection
from services.model.uploads import upload


def sweep(embedding: torch.nn.Embedding, projection: TextProjection, max_rows: int,
          device: torch.device) -> tuple[list[float], list[float]]:
    """Milliseconds of (the upload and embedding, the projection) at each row count 1..max_rows, the device drained
    before and after each part (the first use is what is timed, not the ops' overlap)."""
    lookups, projections = [], []
    for rows in range(1, max_rows + 1):
        ids = torch.arange(rows, dtype=torch.long) % embedding.num_embeddings
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        embedded = embedding(upload(ids, device))
        torch.cuda.synchronize(device)
        middle = time.perf_counter()
        projection(embedded)
        torch.cuda.synchronize(device)
        lookups.append((middle - start) * 1e3)
        projections.append((time.perf_counter() - middle) * 1e3)
    return lookups, projections


def pinned_allocations(max_power: int = 20) -> list[dict]:
    """Milliseconds of a pinned host tensor's allocation at each power-of-two size, the first time and again (the
    caching host allocator keeps a freed block for its size class)."""
    rows = []
    for power in range(6, max_power + 1):
        timed = []
        for _ in range(2):
            start = time.perf_counter()
            block = torch.empty(2**power, dtype=torch.uint8, pin_memory=True)
            timed.append((time.perf_counter() - start) * 1e3)
            del block
        rows.append({"bytes": 2**power, "first_ms": round(timed[0], 3), "again_ms": round(timed[1], 3)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-rows", type=int, default=160)
    parser.add_argument("--text-hidden", type=int, default=2048, help="the 1.7B talker's text width")
    parser.add_argument("--hidden", type=int, default=2048, help="the 1.7B talker's width")
    parser.add_argument("--vocab", type=int, default=151936)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    with torch.inference_mode():
        embedding = torch.nn.Embedding(args.vocab, args.text_hidden).to(device, torch.bfloat16)
        projection = TextProjection(args.text_hidden, args.hidden, "silu").to(device, torch.bfloat16)
        pinned = pinned_allocations()
        first_lookup, first = sweep(embedding, projection, args.max_rows, device)
        second_lookup, second = sweep(embedding, projection, args.max_rows, device)

    def spikes(one: list[float], two: list[float]) -> list[dict]:
        return [{"rows": rows, "first_ms": round(a, 3), "second_ms": round(b, 3)}
                for rows, (a, b) in enumerate(zip(one, two), start=1) if a - b > 0.3]

    report = {"cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", "(unset: torch's default)"),
              "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "projection_first_ms": [round(t, 3) for t in first],
              "projection_second_ms": [round(t, 3) for t in second],
              "lookup_first_ms": [round(t, 3) for t in first_lookup],
              "lookup_second_ms": [round(t, 3) for t in second_lookup],
              "projection_spikes_over_0.3ms": spikes(first, second),
              "lookup_spikes_over_0.3ms": spikes(first_lookup, second_lookup), "pinned_allocations": pinned}
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=1)

    def listed(found: list[dict]) -> str:
        return ", ".join(f"{s['rows']} (+{s['first_ms'] - s['second_ms']:.2f})" for s in found) or "none"

    print(f"{report['cuda_module_loading']}: projection {sum(first):.1f} ms first sweep, {sum(second):.1f} second; "
          f"first uses over 0.3 ms at rows {listed(report['projection_spikes_over_0.3ms'])}; lookups at rows "
          f"{listed(report['lookup_spikes_over_0.3ms'])}; pinned first/again ms by size: "
          + " ".join(f"{p['bytes']}:{p['first_ms']}/{p['again_ms']}" for p in pinned))

if __name__ == "__main__":
    main()
