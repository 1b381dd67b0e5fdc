#!/usr/bin/env bash
# The fair two-GPU benchmark (issue 20, item 3): every topology on the same two GPUs, one after another, same prompts,
# same levels, same per-engine limits, each service placed with `voxmesh up --gpus` (services/mesh/gpu_placement.py):
#   replicas  two independent decode + vocoder pairs, one a GPU, behind one gateway (plain replication)
#   1p1d      decode and vocoder on GPU 0, prefill on GPU 1 (KV over UCX, CUDA IPC)
#   split     decode on GPU 0, the vocoder on GPU 1
#   mtp       decode and vocoder on GPU 0, the code predictor on GPU 1
#   single    decode and vocoder on GPU 0 alone (the one-GPU reference; GPU 1 idle)
# On the `device` tool's nvidia-h200-x2 kind, from the repository root, the wheels the image lacks in /tmp/site
# (the ucxx-cu13 set too, for 1p1d), NCCL/NVSHMEM multicast left off as KINDS.md says:
#   VOXMESH_COMMIT=<commit> bash loadtest/gpu/two_gpu_compare.sh [replicas 1p1d split mtp single]
# A topology takes ~3 minutes: split the list over calls of 10 minutes. CPU rehearsal (tiny model, short levels;
# `--gpus` only sets CUDA_VISIBLE_DEVICES there):
#   PRESET=tiny DEVICE=cpu DTYPE=float32 CLOSED="1 4" RATES=2 OPEN_S=5 bash loadtest/gpu/two_gpu_compare.sh replicas
# Tables under $OUT/<topology>/table.md; record the figures in a loadtest/results/history-gpu-<date>.md section with
# the card, the commit and the command.
set -u
TOPOLOGIES=${*:-replicas 1p1d split mtp single}
ROOT=${OUT:-$PWD/.devrun/two_gpu}
PRESET=${PRESET:-0.6b} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16}
CLOSED=${CLOSED:-"1 64 128"} RATES=${RATES:-"20 40"} OPEN_S=${OPEN_S:-40} PER_STREAM=${PER_STREAM:-4}
LIMITS=${LIMITS:-"--max-num-seqs 64 --kv-cache-blocks 4096"}  # each engine's, whatever the topology
export VOXMESH_UCX_TLS=${VOXMESH_UCX_TLS:-cuda_copy,cuda_ipc,tcp,self,sm}
export VOXMESH_UCX_NET_DEVICES=${VOXMESH_UCX_NET_DEVICES:-all} VOXMESH_PREFILL_MIN_CHARS=${VOXMESH_PREFILL_MIN_CHARS:-1}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

placement() {  # the --gpus flags of a topology
  case $1 in
    replicas) echo "--gpus decode=0,1 --gpus vocoder=0,1";;
    1p1d) echo "--gpus decode=0 --gpus vocoder=0 --gpus prefill=1";;
    split) echo "--gpus decode=0 --gpus vocoder=1";;
    mtp) echo "--gpus decode=0 --gpus vocoder=0 --gpus mtp=1";;
    single) echo "--gpus decode=0 --gpus vocoder=0";;
    *) echo "two_gpu_compare.sh: no placement for topology $1" >&2; return 1;;
  esac
}

for topo in $TOPOLOGIES; do
  gpus=$(placement "$topo") || exit 2
  mkdir -p "$ROOT/$topo"
  echo "== $topo: $gpus"
  OUT=$ROOT/$topo bash loadtest/gpu/gpu_mesh_run.sh --wheels none --preset "$PRESET" --device "$DEVICE" \
    --dtype "$DTYPE" --prompts "${PROMPTS:-.devrun/prompts_en.tsv}" --closed "$CLOSED" \
    --closed-per-stream "$PER_STREAM" --rates "$RATES" --open-seconds "$OPEN_S" --deadline "${DEADLINE_S:-200}" \
    --up-args "--topology $topo $LIMITS $gpus" 2>&1 \
    | grep -E "^\| |ERROR|Error|serving after|GPU during|decode engine" | head -24
done
