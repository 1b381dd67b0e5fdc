"""Benchmarks of voxmesh: `bench/` (the `voxmesh bench` library and the Locust user, installed with the package),
`gpu/` (GPU micro-benchmarks, UCX probes and device scripts) and `results/` (dated result files); the last two
live in the source tree only."""
