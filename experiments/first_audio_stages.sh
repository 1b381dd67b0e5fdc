#!/usr/bin/env bash
# Where a request's first audio goes at low load (issue 41): one `voxmesh up` with the 1.7B preset, the public method's
# transport (HTTP, raw PCM, realistic lengths), a closed level of one stream and open levels, each run once with the
# mesh's default first chunk and once with a one-frame first chunk (the request's `initial_chunk_frames`; CHUNKS lists
# the passes in order: "default 1 1 default" runs both orders on one mesh), every first packet broken into stages from
# the mesh's lifecycle events (`--events-url`), and a py-spy of every service during the last level (PROFILE=0: none),
# with TRACE_S=T also a device trace of decode and the vocoder for T seconds then (services/runtime/device_trace.py,
# summed up by loadtest/gpu/device_trace_summary.py). Everything comes back as $OUT/out.tgz. Through the `device` tool
# from the repository root with `.whl/` and `.devrun/prompts_en.tsv`:
#   bash experiments/first_audio_stages.sh
# CPU rehearsal: WHEELS=none PRESET=tiny DEVICE=cpu DTYPE=float32 RATES="2" REQUESTS=8 bash experiments/first_audio_stages.sh
set -uo pipefail
PRESET=${PRESET:-1.7b} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16} RATES=${RATES:-10 20} REQUESTS=${REQUESTS:-150}
CHUNKS=${CHUNKS:-default 1} BUDGET_S=${BUDGET_S:-380}
OUT=${OUT:-$PWD/.devrun/out}
source "$(dirname "$0")/device_setup.sh"
ckpt=/tmp/stages_ckpt_$PRESET
checkpoint "$ckpt"
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
state=$(mktemp -d)
up_flags=(--max-num-seqs 64 --kv-cache-blocks 4096)
[ "$DEVICE" = cpu ] && up_flags=()
TRACE_S=${TRACE_S:-0}
[ "$TRACE_S" != 0 ] && export VOXMESH_DEVICE_TRACE_DIR="$OUT/traces" VOXMESH_DEVICE_TRACE_S="$TRACE_S"
"$PY" -m services.cli up --model "$ckpt" --device "$DEVICE" --dtype "$DTYPE" --port "$port" --state-dir "$state" "${up_flags[@]}" >"$OUT/up.log" 2>&1 &
up_pid=$!
trap 'kill -INT $up_pid 2>/dev/null; wait $up_pid 2>/dev/null' EXIT
until grep -q "voxmesh is serving" "$OUT/up.log"; do
  if ! kill -0 $up_pid 2>/dev/null || [ "$(left)" -le 60 ]; then echo "mesh did not start"; tail -20 "$OUT/up.log"; exit 1; fi
  sleep 1
done
echo "== serving after $SECONDS s"
nats_url=$(grep -o "NATS nats://[0-9.:]*" "$OUT/up.log" | head -n 1 | cut -d' ' -f2)
export VOXMESH_NATS_USER=observer VOXMESH_NATS_PASSWORD_FILE="$state/nats-auth/observer.password"  # read-only
common=(--url "http://127.0.0.1:$port" --events-url "$nats_url" --transport http
        --length-mode realistic --prompts "$PWD/.devrun/prompts_en.tsv" --no-plot --level-timeout 90)
profile() {  # a window into the level's steady state, not a synchronisation
  sleep 4
  profile_mesh "$up_pid" "" 5 --gil --threads
}
pass=0
for chunk in $CHUNKS; do  # CHUNKS="default 1 1 default": both orders on one mesh, each pass its own files
  pass=$((pass + 1))
  chunk_flag=(); [ "$chunk" != default ] && chunk_flag=(--initial-chunk-frames "$chunk")
  [ "$(left)" -le 30 ] && { echo "budget spent before pass $pass (chunk $chunk)"; break; }
  echo "== pass $pass, first chunk $chunk"
  timeout -s INT "$(left)" "$PY" -m services.cli bench "${common[@]}" "${chunk_flag[@]}" --mode closed --concurrency 1 \
    --requests 20 --out "$OUT/c1_pass${pass}_chunk_$chunk.json" 2>&1 | tail -n 4
  profiler=""
  [ "$pass" = "$(wc -w <<<"$CHUNKS")" ] && [ "${PROFILE:-1}" = 1 ] && { profile & profiler=$!; }
  timeout -s INT "$(left)" "$PY" -m services.cli bench "${common[@]}" "${chunk_flag[@]}" --mode open --rates $RATES \
    --requests "$REQUESTS" --out "$OUT/open_pass${pass}_chunk_$chunk.json" 2>&1 | tail -n 8
done
[ -n "${profiler:-}" ] && wait "$profiler"
echo "== done after $SECONDS s"
kill -INT $up_pid 2>/dev/null; wait $up_pid 2>/dev/null; trap - EXIT  # its logs complete before they are packed
if ls "$OUT"/traces/*.json.gz >/dev/null 2>&1; then
  "$PY" -m loadtest.gpu.device_trace_summary "$OUT"/traces/*.json.gz --out "$OUT/device_trace_summary.json" \
    | tee "$OUT/device_trace_summary.txt" | head -n 60
  rm -rf "$OUT/traces"
fi
pack_out
