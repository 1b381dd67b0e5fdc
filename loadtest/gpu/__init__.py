"""GPU micro-benchmarks, UCX KV hand-off probes and the device scripts that run them (`device_run.sh`,
`gpu_mesh_run.sh`); their figures are in loadtest/RESULTS-GPU.md. Run from the source tree, never installed."""
