#!/usr/bin/env bash
# Two topologies up at once on one machine, measured by one `voxmesh bench --compare-url` run a level at a time,
# levels alternating between them (issue 14, item 5: "single vs mtp vs 1p1d, same prompts, aligned limits"). Both
# meshes are up for the whole run; the idle one holds its GPU memory but takes no GPU time, so each level sees the
# card as the other did. From the repository root, with the wheels the GPU image lacks already on PYTHONPATH (and
# the ucxx-cu13 set for 1p1d: GPU-NOTES.md lists it):
#   VOXMESH_COMMIT=<commit> bash loadtest/gpu/topology_side_by_side.sh single 1p1d
# CPU rehearsal (tiny model, short levels):
#   PRESET=tiny DEVICE=cpu DTYPE=float32 CLOSED="1 2" RATES=1 OPEN_S=8 PER_STREAM=2 \
#     bash loadtest/gpu/topology_side_by_side.sh single 1p1d
# Writes under $OUT: table.txt (the bench tables with ratios), bench_docs.tgz (every request), up_<topology>.log.
set -u
BASELINE=${1:-single} CANDIDATE=${2:-1p1d}
PRESET=${PRESET:-0.6b} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16}
CLOSED=${CLOSED:-"1 64"} RATES=${RATES:-20} OPEN_S=${OPEN_S:-60} PER_STREAM=${PER_STREAM:-4} FRAMES=${FRAMES:-48}
LIMITS=${LIMITS:-"--max-num-seqs 64 --kv-cache-blocks 4096"} DEADLINE_S=${DEADLINE_S:-560} READY_S=${READY_S:-240}
PROMPTS=${PROMPTS:-.devrun/prompts_en.tsv}
[ -f "$PROMPTS" ] || PROMPTS=../shared/data/prompts_en.tsv
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/.devrun/side_by_side}
WORK=$(mktemp -d /tmp/voxmesh_pair.XXXXXX)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export VOXMESH_UCX_TLS=${VOXMESH_UCX_TLS:-cuda_copy,cuda_ipc,tcp,self,sm}
export VOXMESH_UCX_NET_DEVICES=${VOXMESH_UCX_NET_DEVICES:-all}
export VOXMESH_PREFILL_MIN_CHARS=${VOXMESH_PREFILL_MIN_CHARS:-1}
PIDS=()
say() { echo "== $(date -u +%T) $*"; }
left() { local s=$((DEADLINE_S - SECONDS - 40)); echo $((s > 0 ? s : 1)); }

finish() {  # stop both meshes (SIGTERM: they drain), keep their logs
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do
    timeout 40 tail --pid="$pid" -f /dev/null || kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  cp "$WORK"/up_*.log "$OUT"/ 2>/dev/null
  
  rm -rf "$WORK"
}
trap finish EXIT

say "voxmesh model init --preset $PRESET --dtype $DTYPE"
timeout 240 "$PY" -m services.cli model init --preset "$PRESET" --dtype "$DTYPE" --out "$WORK/model" \
  >"$WORK/model_init.log" 2>&1 || { tail -c 2000 "$WORK/model_init.log"; say "model init FAILED"; exit 1; }

declare -A PORTS
for topology in "$BASELINE" "$CANDIDATE"; do  # both start at once: their start-ups overlap
  PORTS[$topology]=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # shellcheck disable=SC2086  # LIMITS is a list of flags
  "$PY" -m services.cli up --model "$WORK/model" --device "$DEVICE" --dtype "$DTYPE" --port "${PORTS[$topology]}" \
    --state-dir "$WORK/state_$topology" --topology "$topology" $LIMITS >"$WORK/up_$topology.log" 2>&1 &
  PIDS+=($!)
done
started=$SECONDS
for topology in "$BASELINE" "$CANDIDATE"; do
  until grep -q "voxmesh is serving" "$WORK/up_$topology.log"; do  # a launcher's log line: polling is fine here
    if [ $((SECONDS - started)) -ge "$READY_S" ]; then
      tail -n 30 "$WORK/up_$topology.log"; say "$topology did not come up"; exit 1
    fi
    sleep 1
  done
  say "$topology serving on port ${PORTS[$topology]} after $((SECONDS - started)) s"
done

common=(--url "http://127.0.0.1:${PORTS[$BASELINE]}" --label "$BASELINE"
        --compare-url "http://127.0.0.1:${PORTS[$CANDIDATE]}" --compare-label "$CANDIDATE"
        --fixed-frames "$FRAMES" --prompts "$PROMPTS" --request-timeout 60 --no-plot)
: >"$WORK/table.txt"
for c in $CLOSED; do
  requests=$((PER_STREAM * c > 8 ? PER_STREAM * c : 8))
  say "closed loop x$c, $requests requests a topology"
  timeout -s INT "$(left)" "$PY" -m services.cli bench "${common[@]}" --mode closed --concurrency "$c" \
    --requests "$requests" --out "$WORK/bench_c$c.json" >>"$WORK/table.txt" 2>"$WORK/bench_c$c.err"
done
for rate in $RATES; do  # OPEN_S seconds of arrivals a rate and a topology: sustained, not survived
  requests=$("$PY" -c "print(max(8, round($rate * $OPEN_S)))")
  say "open loop $rate/s, $requests requests a topology"
  timeout -s INT "$(left)" "$PY" -m services.cli bench "${common[@]}" --mode open --rates "$rate" \
    --requests "$requests" --out "$WORK/bench_r$rate.json" >>"$WORK/table.txt" 2>"$WORK/bench_r$rate.err"
done
tar czf "$OUT/bench_docs.tgz" -C "$WORK" $(cd "$WORK" && ls bench_*.json 2>/dev/null) 2>/dev/null
cp "$WORK/table.txt" "$OUT/table.txt"
cat "$WORK/table.txt"
