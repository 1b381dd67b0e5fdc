#!/usr/bin/env bash
# The GPU harness in one command, run from the repository root on the GPU machine (the `device` tool's `run`):
#   VOXMESH_COMMIT=<commit> bash loadtest/gpu/device_run.sh [model] [codec] [engine] [ucx]   (default: all four)
# Installs the carried wheels in .whl/ (UCX: ucxx, libucx, rmm and friends; see ../shared/GPU-NOTES.md) into
# /tmp/site, runs the micro-benchmarks, the two-process UCX KV hand-off and the engine step loop (tiny via
# engine_step_bench's CLI, 0.6B in memory), and prints the short tables last. Every JSON report and log lands in
# $OUT/results.tgz (re-packed after each part, since the device tool returns at most 8 files), plus tables.md.
set -uo pipefail
OUT="${OUT:-$PWD/.devrun}"
COMMIT="${VOXMESH_COMMIT:-unknown}"
PARTS="${*:-model codec engine ucx}"
WORK="$(mktemp -d /tmp/voxmesh_gpu.XXXXXX)"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

step() {  # step NAME TIMEOUT_S COMMAND...: run one part with a time limit, log it, remember a failure
  local name=$1 limit=$2; shift 2
  echo "== $name: $*"
  timeout "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  grep -v '^USDT:' "$WORK/$name.log" | tail -n 12
  if [ $rc -ne 0 ]; then echo "== $name FAILED (rc $rc)"; status=1; fi
  tar czf "$OUT/results.tgz" -C "$WORK" .
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
  --format=csv >"$WORK/gpu.txt" 2>&1
{ date -u +%FT%TZ; echo "commit $COMMIT"; python3 -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'; } >>"$WORK/gpu.txt"
cat "$WORK/gpu.txt"

case " $PARTS " in *" ucx "*)
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH="$PYTHONPATH:/tmp/site" || { echo "== wheel install FAILED"; status=1; }
  else
    echo "== no .whl/ carried: the UCX part needs ucxx"
  fi;;
esac

reports=()
case " $PARTS " in *" model "*)
  step micro_model 200 python3 -m loadtest.gpu.gpu_micro --parts model --out "$WORK/micro_model.json" --commit "$COMMIT"
  reports+=("$WORK/micro_model.json");; esac
case " $PARTS " in *" codec "*)
  step micro_codec 150 python3 -m loadtest.gpu.gpu_micro --parts codec --out "$WORK/micro_codec.json" --commit "$COMMIT"
  reports+=("$WORK/micro_codec.json");; esac
case " $PARTS " in *" ucx "*)
  mkdir -p "$WORK/ucx_logs"
  step ucx 120 python3 -m loadtest.gpu.ucx_kv_handoff --out "$WORK/ucx.json" --device cuda --logs "$WORK/ucx_logs" \
    --timeout 100 --commit "$COMMIT"
  reports+=("$WORK/ucx.json");; esac

case " $PARTS " in *" engine "*)
  step engine_tiny 90 python3 -m loadtest.gpu.engine_step_bench --out "$WORK/engine_tiny.json" --device cuda \
    --batch-sizes 1 8 32 64
  step engine_06b 150 python3 -m loadtest.gpu.gpu_engine --out "$WORK/engine_06b.json" --device cuda --commit "$COMMIT"
  reports+=("$WORK/engine_tiny.json" "$WORK/engine_06b.json");; esac

python3 -m loadtest.gpu.gpu_table "${reports[@]}" | tee "$WORK/tables.md"
cp "$WORK/tables.md" "$OUT/tables.md"
tar czf "$OUT/results.tgz" -C "$WORK" .
exit $status
