#!/usr/bin/env bash
# Whether `voxmesh up --cuda-mps` does on a card what its tests check with a stand-in: a daemon on the state dir's
# pipe folder, decode and the vocoder its clients (nvidia-smi lists an MPS server, and the daemon's log its clients),
# requests served, and after Ctrl-C no MPS process left. One mesh, the 0.6B preset (random bf16 weights), a closed
# level of one stream. Through the `device` tool from the repository root with `.whl/` and `.devrun/prompts_en.tsv`:
#   bash experiments/cuda_mps_check.sh
# Prints one PASS or FAIL line per check; everything else comes back as $OUT/out.tgz.
set -uo pipefail
PRESET=${PRESET:-0.6b} DTYPE=bfloat16 BUDGET_S=${BUDGET_S:-240}
OUT=${OUT:-$PWD/.devrun/out}
source "$(dirname "$0")/device_setup.sh"
ckpt=/tmp/mps_check_ckpt_$PRESET
checkpoint "$ckpt"
state=$(mktemp -d) port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$PY" -m services.cli up --model "$ckpt" --device cuda --dtype bfloat16 --port "$port" --state-dir "$state" \
  --cuda-mps >"$OUT/up.log" 2>&1 &
pid=$!
check() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; fi; }
until grep -q "voxmesh is serving" "$OUT/up.log"; do
  if ! kill -0 $pid 2>/dev/null || [ "$(left)" -le 60 ]; then echo "FAIL the mesh did not start"; tail -20 "$OUT/up.log"
    kill -INT $pid 2>/dev/null; wait; pack_out; exit 1; fi
  sleep 1
done
pipe=$state/cuda-mps/pipe
check "the serving line names the daemon" "grep -q 'CUDA MPS on $pipe' '$OUT/up.log'"
nvidia-smi >"$OUT/nvidia_smi_serving.txt"
check "nvidia-smi lists an MPS server" "grep -q nvidia-cuda-mps-server '$OUT/nvidia_smi_serving.txt'"
echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe nvidia-cuda-mps-control >"$OUT/server_list.txt" 2>&1
check "the mesh's daemon runs a server" "grep -q '[0-9]' '$OUT/server_list.txt'"
timeout -s INT "$(left)" "$PY" -m services.cli bench --url "http://127.0.0.1:$port" --transport http \
  --prompts "$PWD/.devrun/prompts_en.tsv" --mode closed --concurrency 1 --requests 10 --no-plot \
  --out "$OUT/c1.json" >"$OUT/bench.log" 2>&1
check "ten requests served" "grep -q 'closed x1 *10/10' '$OUT/bench.log'"
kill -INT $pid; wait $pid
cp -r "$state/cuda-mps/log" "$OUT/mps_log" 2>/dev/null
check "the daemon's log names its clients" "grep -qi 'client' '$OUT'/mps_log/*.log"
for _ in $(seq 20); do pgrep -f nvidia-cuda-mps >/dev/null || break; sleep 0.5; done  # the server exits after its clients
check "no MPS process left after Ctrl-C" "! pgrep -f nvidia-cuda-mps >/dev/null"
pack_out
