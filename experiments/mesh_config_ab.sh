#!/usr/bin/env bash
# Configurations of one mesh side by side on one GPU (issue 41's levers): one `voxmesh up` with the 1.7B preset per
# mesh named in ORDER, all up at once; mesh A as shipped, each other mesh X with the environment X_ENV adds (a
# setting's VOXMESH_ variables), X_UP (more `voxmesh up` arguments, after the shipped ones: `--topology replicas
# --kv-cache-blocks 1024`), X_MPS=1 (its processes are clients of a CUDA MPS server this script starts and stops;
# the other meshes' are not) and, if X_TREE names one, the code of another tree (a commit's `git archive`, to
# compare commits); passes in ORDER ("A B B A": both orders), each a closed level of one stream then open levels at
# RATES, with the public method's transport (HTTP, raw PCM, realistic lengths) and every first packet broken into
# stages from its mesh's events. Only one mesh has load at a time; everything comes back as $OUT/out.tgz. Through the
# `device` tool from the repository root with `.whl/` and `.devrun/prompts_en.tsv`:
#   VOXMESH_COMMIT=$(git rev-parse HEAD) B_ENV="VOXMESH_OVERLAP_MIN_ROWS=32" bash experiments/mesh_config_ab.sh
#   ORDER="A B C C B A" A_TREE=.devtree_old B_ENV="" C_ENV="VOXMESH_ONE_FRAME_FIRST_CHUNK_BELOW=32" bash ...
#   ORDER="A B C C B A" B_UP="--topology replicas" C_UP="--topology replicas" C_MPS=1 bash ...
# Other loads: CLOSED (closed levels by concurrency, "1" by default: C1_REQUESTS requests at one stream, else
# CLOSED_PER_STREAM a stream), RATES="" (no open level), TRANSPORT (http) and LENGTH ("--length-mode realistic", or
# "--fixed-frames 48"); UP_FLAGS replaces the shipped flags every mesh shares. The 256-stream target, 0.6B:
#   PRESET=0.6b UP_FLAGS="--max-num-seqs 256 --kv-cache-blocks 8192" CLOSED="64 256" RATES="" TRANSPORT=websocket \
#   LENGTH="--fixed-frames 48" A_ENV="VOXMESH_MAX_STREAMS=256" B_ENV="VOXMESH_MAX_STREAMS=256 ..." bash ...
# PROFILE_PASSES="1": during each closed level of those passes, a py-spy of every service of the level's mesh
# (`--threads --idle`, PROFILE_S seconds from PROFILE_AFTER_S into the level: profile_pass<k>_<level>_<service>.txt),
# and with TRACE_S=T a device trace of decode and the vocoder for T seconds then, summed up in
# device_trace_pass<k>_<level>.txt/.json (KEEP_TRACES=1: the raw traces too, in traces_pass<k>_<level>/): a mesh's
# first level of a load against its second (CLOSED="64 256 256"); PROFILE_STREAMS="256": only levels of those
# concurrencies.
# (VOXMESH_COMMIT names the tree in the bench's JSONs: the machine's copy may carry a stale .git.)
# CPU rehearsal: WHEELS=none PRESET=tiny DEVICE=cpu DTYPE=float32 RATES="2" REQUESTS=8 C1_REQUESTS=4 \
#   B_ENV="VOXMESH_OVERLAP_MIN_ROWS=32" bash experiments/mesh_config_ab.sh
set -uo pipefail
PRESET=${PRESET:-1.7b} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16} RATES=${RATES-20 40} REQUESTS=${REQUESTS:-200}
C1_REQUESTS=${C1_REQUESTS:-20} ORDER=${ORDER:-A B B A} BUDGET_S=${BUDGET_S:-540}
CLOSED=${CLOSED:-1} CLOSED_PER_STREAM=${CLOSED_PER_STREAM:-8} TRANSPORT=${TRANSPORT:-http}
LENGTH=${LENGTH:---length-mode realistic}
OUT=${OUT:-$PWD/.devrun/out}
source "$(dirname "$0")/device_setup.sh"
[ -n "${VOXMESH_COMMIT:-}" ] || echo "VOXMESH_COMMIT is unset: the bench's JSONs name the commit of whatever .git is here"
ckpt=/tmp/ab_ckpt_$PRESET
checkpoint "$ckpt"
read -r -a up_flags <<<"${UP_FLAGS:---max-num-seqs 64 --kv-cache-blocks 4096}"
[ "$DEVICE" = cpu ] && [ -z "${UP_FLAGS:-}" ] && up_flags=()
read -r -a length_args <<<"$LENGTH"
read -r -a meshes <<<"$(tr ' ' '\n' <<<"$ORDER" | awk 'NF && !seen[$0]++' | paste -sd' ')"
TRACE_S=${TRACE_S:-0} PROFILE_PASSES=${PROFILE_PASSES:-}
PROFILE_AFTER_S=${PROFILE_AFTER_S:-3} PROFILE_S=${PROFILE_S:-5}
[ "$TRACE_S" != 0 ] && export VOXMESH_DEVICE_TRACE_DIR="$OUT/traces" VOXMESH_DEVICE_TRACE_S="$TRACE_S"
profile_level() {  # profile_level MESH NAME: a window into the level's steady state (the sleep is the window's
  sleep "$PROFILE_AFTER_S"  # offset, not a synchronisation)
  local before; before=$(grep -c "device trace written" "$OUT/up_$1.log")
  profile_mesh "${pid[$1]}" "$2_" "$PROFILE_S" --threads --idle
  [ "$TRACE_S" = 0 ] && return 0
  for _ in $(seq 60); do  # the traces are written after their window, off each service's loop: await the lines
    [ "$(grep -c "device trace written" "$OUT/up_$1.log")" -ge $((before + signalled)) ] && break
    sleep 1
  done
  ls "$OUT"/traces/*.json.gz >/dev/null 2>&1 || { echo "no device trace for $2"; return 0; }
  "$PY" -m loadtest.gpu.device_trace_summary "$OUT"/traces/*.json.gz --out "$OUT/device_trace_$2.json" \
    >"$OUT/device_trace_$2.txt" 2>&1
  if [ "${KEEP_TRACES:-0}" = 1 ]; then mkdir -p "$OUT/traces_$2" && mv "$OUT"/traces/*.json.gz "$OUT/traces_$2/"
  else rm -f "$OUT"/traces/*.json.gz; fi  # the summary comes back; raw traces can pass the device tool's file limit
}
mps_pipe=""
mps_start() {  # one MPS control daemon for the meshes that ask, on pipe and log folders of its own
  mps_pipe=$(mktemp -d) mps_log=$(mktemp -d)
  CUDA_MPS_PIPE_DIRECTORY=$mps_pipe CUDA_MPS_LOG_DIRECTORY=$mps_log nvidia-cuda-mps-control -d \
    || { echo "could not start the MPS control daemon"; exit 1; }
  echo "MPS control daemon on $mps_pipe"
}
mps_stop() {
  [ -n "$mps_pipe" ] || return 0
  echo quit | CUDA_MPS_PIPE_DIRECTORY=$mps_pipe nvidia-cuda-mps-control
  cp "$mps_log"/*.log "$OUT/" 2>/dev/null
}
declare -A port state pid
for mesh in "${meshes[@]}"; do
  env_name=${mesh}_ENV tree_name=${mesh}_TREE up_name=${mesh}_UP mps_name=${mesh}_MPS
  [ "$mesh" = A ] || [ -n "${!env_name+set}" ] || [ -n "${!tree_name:-}" ] || [ -n "${!up_name:-}" ] \
    || [ -n "${!mps_name:-}" ] || { echo "name ${mesh}_ENV, ${mesh}_TREE, ${mesh}_UP or ${mesh}_MPS"; exit 1; }
  tree=$(cd "${!tree_name:-.}" && pwd)
  port[$mesh]=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  state[$mesh]=$(mktemp -d)
  read -r -a extra <<<"${!env_name:-}"
  read -r -a more_up <<<"${!up_name:-}"
  if [ "${!mps_name:-0}" = 1 ]; then
    [ -n "$mps_pipe" ] || mps_start
    extra+=("CUDA_MPS_PIPE_DIRECTORY=$mps_pipe" "CUDA_MPS_LOG_DIRECTORY=$mps_log")
  fi
  (cd "$tree" && exec env "${extra[@]}" PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m services.cli up \
    --model "$ckpt" --device "$DEVICE" --dtype "$DTYPE" --port "${port[$mesh]}" --state-dir "${state[$mesh]}" \
    "${up_flags[@]}" "${more_up[@]}" >"$OUT/up_$mesh.log" 2>&1) &
  pid[$mesh]=$!
  echo "mesh $mesh: tree $tree, environment '${extra[*]}', up '${more_up[*]}'"
done
trap 'kill -INT "${pid[@]}" 2>/dev/null; wait 2>/dev/null; mps_stop' EXIT
for mesh in "${meshes[@]}"; do
  until grep -q "voxmesh is serving" "$OUT/up_$mesh.log"; do
    if ! kill -0 "${pid[$mesh]}" 2>/dev/null || [ "$(left)" -le 60 ]; then
      echo "mesh $mesh did not start"; tail -20 "$OUT/up_$mesh.log"; exit 1
    fi
    sleep 1
  done
done
echo "== every mesh serving after $SECONDS s"
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
grep -h "decode settings" "$OUT"/up_*.log | grep -o "overlap_min_rows=[0-9]*\|steps_queued=[0-9]*" | paste -sd' '
pass=0
for mesh in $ORDER; do
  pass=$((pass + 1))
  [ "$(left)" -le 30 ] && { echo "budget spent before pass $pass (mesh $mesh)"; break; }
  nats_url=$(grep -o "NATS nats://[0-9.:]*" "$OUT/up_$mesh.log" | head -n 1 | cut -d' ' -f2)
  common=(--url "http://127.0.0.1:${port[$mesh]}" --events-url "$nats_url" --transport "$TRANSPORT" "${length_args[@]}"
          --prompts "$PWD/.devrun/prompts_en.tsv" --no-plot --level-timeout 90)
  echo "== pass $pass, mesh $mesh"
  export VOXMESH_NATS_USER=observer VOXMESH_NATS_PASSWORD_FILE="${state[$mesh]}/nats-auth/observer.password"
  for streams in $CLOSED; do  # c<streams>_pass<k>_<mesh>.json (c1_... as earlier runs named it); a level repeated
    name=c$streams               # in a pass (CLOSED="64 256 256") is c<streams>_again_pass...
    [ -e "$OUT/${name}_pass${pass}_$mesh.json" ] && name=${name}_again
    requests=$((streams == 1 ? C1_REQUESTS : streams * CLOSED_PER_STREAM))
    profiler=""
    if [[ " $PROFILE_PASSES " == *" $pass "* ]] && [[ " ${PROFILE_STREAMS:-$streams} " == *" $streams "* ]]; then
      profile_level "$mesh" "pass${pass}_$name" & profiler=$!
    fi
    timeout -s INT "$(left)" "$PY" -m services.cli bench "${common[@]}" --mode closed --concurrency "$streams" \
      --requests "$requests" --out "$OUT/${name}_pass${pass}_$mesh.json" 2>&1 | tail -n 4
    [ -n "$profiler" ] && wait "$profiler"
  done
  [ -z "$RATES" ] || timeout -s INT "$(left)" "$PY" -m services.cli bench "${common[@]}" --mode open --rates $RATES \
    --requests "$REQUESTS" --out "$OUT/open_pass${pass}_$mesh.json" 2>&1 | tail -n 8
done
echo "== done after $SECONDS s"
kill -INT "${pid[@]}" 2>/dev/null; wait 2>/dev/null; trap - EXIT  # their logs complete before they are packed
mps_stop
pack_out
