"""The soak outside CI: a mesh (`voxmesh up`: the tiny model on the CPU by default, any checkpoint and device with
`--up-args`) under `voxmesh bench` for minutes, closed loop or open loop (`--rate`), every mesh process, the GPU and
every NATS stream sampled once the warm-up is over and again at the end, both at a quiet moment, and every request's
first audio and first-packet stages compared between the first and the last minute.

Flat means: each process's resident memory within 5% of its start, its descriptors and threads equal; REQUESTS empty
and every durable consumer caught up; EVENTS, CODES and the KV bucket growing by what each request stores, all of it
younger than the stream's retention; no failed request; each card's and each process's GPU memory within 5% (where
nvidia-smi is); the last minute's p95 latencies within the first's x 1.25 + 5 ms. `python -m loadtest.soak --help`;
figures in loadtest/results/ and the README's reliability table. Linux only (it reads /proc). Source tree only, like
loadtest/gpu.
"""
