"""The device harness: the whole mesh on a GPU machine (`gpu_mesh_run.sh`), two trees or configurations side by side
(`commit_ab.sh`), topologies on two GPUs (`two_gpu_compare.sh`), the wheels the machine lacks (`fetch_wheels.sh`), and
the probes behind loadtest/RESULTS-GPU.md's standing figures. Run from the source tree (loadtest/README.md), never
installed."""
