"""What a fresh process pays the first time its eager prompt path meets a row count (issue 41's fresh meshes).

Decode builds each request's prompt rows eagerly (`services/model/prompt.py`): the text embedding and the talker's
`TextProjection` over the request's token count, through cuBLAS, whose kernel for a GEMM depends on its row count.
On one stream a fresh mesh answered two of twenty prompts ~4.5 ms late the first time it met them, and on time
the second. This times the same ops at every row count from 1 to `--max-rows`, ascending, twice in one process: a
first-sweep cost well above the second's is a first use (a kernel loaded, a heuristic computed, pinned memory
allocated). Run once as is and once with CUDA_MODULE_LOADING=EAGER (every kernel loaded at start): if the spikes
go away there, they are lazy kernel loading.

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


def sweep(embedding: torch.nn.Embedding, projection: TextProjection, max_rows: int, device: torch.device) -> list[float]:
    """Milliseconds of an upload, embedding and projection at each row count 1..max_rows, the device drained before
    and after each (the first use is what is timed, not the ops' overlap)."""
    times = []
    for rows in range(1, max_rows + 1):
        ids = torch.arange(rows, dtype=torch.long) % embedding.num_embeddings
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        projection(embedding(upload(ids, device)))
        torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


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
        first = sweep(embedding, projection, args.max_rows, device)
        second = sweep(embedding, projection, args.max_rows, device)
    excess = [round(a - b, 3) for a, b in zip(first, second)]
    spikes = [{"rows": rows, "first_ms": round(first[rows - 1], 3), "second_ms": round(second[rows - 1], 3)}
              for rows in range(1, args.max_rows + 1) if excess[rows - 1] > 0.3]
    report = {"cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", "(unset: torch's default)"),
              "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "first_ms": [round(t, 3) for t in first], "second_ms": [round(t, 3) for t in second],
              "spikes_over_0.3ms": spikes, "first_total_ms": round(sum(first), 1),
              "second_total_ms": round(sum(second), 1)}
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=1)
    print(f"{report['cuda_module_loading']}: first sweep {report['first_total_ms']} ms, second "
          f"{report['second_total_ms']} ms; first uses over 0.3 ms at rows "
          + ", ".join(f"{s['rows']} (+{s['first_ms'] - s['second_ms']:.2f})" for s in spikes))


if __name__ == "__main__":
    main()
