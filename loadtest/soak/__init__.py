"""The soak outside CI: the CPU mesh (`voxmesh up`, the tiny model) under `voxmesh bench` for minutes, every mesh
process and every NATS stream sampled once the warm-up is over and again at the end, both at a quiet moment.

Flat means: each process's resident memory within 5% of its start, its descriptors and threads equal; REQUESTS empty
and every durable consumer caught up; EVENTS, CODES and the KV bucket growing by what each request stores, all of it
younger than the stream's retention. `python -m loadtest.soak --help`; figures in loadtest/results/ and the README's
reliability table. Linux only (it reads /proc). Source tree only, like loadtest/gpu.
"""
