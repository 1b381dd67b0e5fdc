#!/usr/bin/env bash
# Two trees' fresh meshes side by side on one card (issue 41): what a mesh's first requests cost, which warm passes of
# `mesh_config_ab.sh` cannot show (a mesh there has met every prompt by its second pass). Each pass in ORDER ("A B B
# A": both orders) starts a fresh `voxmesh up` of tree A (A_TREE, a folder: `git archive C | tar x -C .devtree_old`)
# or tree B (B_TREE, this tree by default) through `voxmesh bench --fresh-mesh`, with the shipped GPU flags and the
# public method's transport (HTTP, raw PCM, realistic lengths), and sends it REQUESTS requests of one stream: the same
# prompts in every pass, so each prompt's `first_frame` stage compares pass by pass (a prompt a fresh mesh meets for
# the first time against the same prompt in the other tree's fresh mesh). PROBE=1 first runs
# `experiments/first_use_shapes.py` twice (lazy kernel loading, then CUDA_MODULE_LOADING=EAGER). Files:
# $OUT/c1_pass<k>_<A|B>.json, each mesh's log in $OUT/mesh_c1_pass<k>/, everything packed as $OUT/out.tgz. Through
# the `device` tool from the repository root with `.whl/`, `.devrun/prompts_en.tsv` and the A tree carried:
#   A_TREE=.devtree_old A_COMMIT=9b7fdd0 VOXMESH_COMMIT=$(git rev-parse --short HEAD) PROBE=1 \
#     bash experiments/fresh_mesh_ab.sh
# CPU rehearsal: WHEELS=none PRESET=tiny DEVICE=cpu DTYPE=float32 UP_FLAGS="" REQUESTS=4 A_TREE=.devtree_old bash ...
set -uo pipefail
PRESET=${PRESET:-1.7b} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16} ORDER=${ORDER:-A B B A} REQUESTS=${REQUESTS:-20}
BUDGET_S=${BUDGET_S:-540} PASS_LIMIT_S=${PASS_LIMIT_S:-110}
OUT=${OUT:-$PWD/.devrun/out}
source "$(dirname "$0")/device_setup.sh"
: "${A_TREE:?A_TREE names the folder of the other tree}"
A_TREE=$(cd "$A_TREE" && pwd) B_TREE=$(cd "${B_TREE:-.}" && pwd) prompts=$PWD/.devrun/prompts_en.tsv
if [ "${PROBE:-0}" = 1 ]; then
  for loading in lazy EAGER; do
    ( [ $loading = EAGER ] && export CUDA_MODULE_LOADING=EAGER
      timeout 75 "$PY" -m experiments.first_use_shapes --out "$OUT/first_use_shapes_$loading.json" ) 2>&1 | tail -n 3
  done
  echo "== probes after $SECONDS s"
fi
ckpt=/tmp/ab_ckpt_$PRESET
checkpoint "$ckpt"
UP="--model $ckpt --device $DEVICE --dtype $DTYPE ${UP_FLAGS---max-num-seqs 64 --kv-cache-blocks 4096 --cuda-mps}"
pass=0
for mesh in $ORDER; do
  pass=$((pass + 1))
  limit=$(( $(left) < PASS_LIMIT_S ? $(left) : PASS_LIMIT_S ))
  [ "$limit" -le 60 ] && { echo "budget spent before pass $pass (tree $mesh)"; break; }
  tree_name=${mesh}_TREE commit_name=${mesh}_COMMIT
  tree=${!tree_name}
  mkdir -p "$OUT/mesh_c1_pass$pass"
  (cd "$tree" && VOXMESH_COMMIT=${!commit_name:-${VOXMESH_COMMIT:-}} PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" \
     timeout -s INT "$limit" "$PY" -m services.cli bench --fresh-mesh --up-args="$UP" \
     --mesh-log-dir "$OUT/mesh_c1_pass$pass" --trials 1 --transport http --length-mode realistic --prompts "$prompts" \
     --no-plot --mode closed --concurrency 1 \
     --requests "$REQUESTS" --out "$OUT/c1_pass${pass}_$mesh.json") 2>&1 | grep -E "closed x1" | tail -n 1
  echo "== pass $pass (tree $mesh: $tree) after $SECONDS s"
done
pack_out
