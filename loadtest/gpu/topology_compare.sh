#!/usr/bin/env bash
# Topologies side by side on one GPU machine (issue 14, item 5): `single`, `mtp` and `1p1d` (each stage its own
# process, all on the one GPU), each under the same `voxmesh bench` levels with the same limits, one after another in
# one device call, through loadtest/gpu/gpu_mesh_run.sh. Run from the repository root on the device (`run`), with
# the wheels the GPU image lacks installed in /tmp/site beforehand (nats, msgspec...; for 1p1d also the ucxx-cu13
# set: GPU-NOTES.md lists it, ~58 MiB, so carry it in its own call):
#   VOXMESH_COMMIT=<commit> bash loadtest/gpu/topology_compare.sh [single mtp 1p1d]
# UCX between prefill and decode uses CUDA IPC there (loopback TCP alone failed on that machine). Tables under
# $OUT/<topology>/table.md; copy the figures into loadtest/RESULTS-GPU.md with the card and the date.
set -u
TOPOLOGIES=${*:-single mtp 1p1d}
ROOT=${OUT:-$PWD/.devrun/topologies}
export VOXMESH_UCX_TLS=cuda_copy,cuda_ipc,tcp,self,sm VOXMESH_UCX_NET_DEVICES=all VOXMESH_PREFILL_MIN_CHARS=1
for topo in $TOPOLOGIES; do
  mkdir -p "$ROOT/$topo"
  OUT=$ROOT/$topo bash loadtest/gpu/gpu_mesh_run.sh --wheels none --prompts "${PROMPTS:-.devrun/prompts_en.tsv}" \
    --closed "1 64" --closed-per-stream 4 --rates "20" --open-seconds 40 --deadline 175 \
    --up-args "--topology $topo --max-num-seqs 64 --kv-cache-blocks 4096" 2>&1 \
    | grep -E "^\| |ERROR|Error|serving after|GPU during|decode engine" | head -20
done
