#!/usr/bin/env bash
# Seeded and greedy requests through each tree's mesh on the GPU, one at a time: the PCM bytes' sha256 per request.
# Equal hashes across trees = the same codes (audio is a pure function of them). Usage: same_audio.sh TREE...
set -uo pipefail
ROOT=$PWD OUT=${OUT:-$PWD/.devrun/out}
mkdir -p "$OUT"
ckpt=/tmp/same_audio_ckpt
texts=("The harbour lights came on one by one." "A quiet voice read the letter twice." "Seven owls sat on the old fence.")
for tree in "$@"; do
  cd "$ROOT/$tree" || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  [ -d $ckpt ] || timeout 240 python3 -m services.cli model init --preset 0.6b --dtype bfloat16 --out $ckpt >/dev/null 2>&1 \
    || { echo "model init failed"; exit 1; }
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  state=$(mktemp -d)
  python3 -m services.cli up --model $ckpt --device cuda --dtype bfloat16 --port "$port" --state-dir "$state" \
    --max-num-seqs 64 --kv-cache-blocks 4096 >"$OUT/up_$tree.log" 2>&1 &
  pid=$!
  started=$SECONDS
  until grep -q "voxmesh is serving" "$OUT/up_$tree.log"; do
    if ! kill -0 $pid 2>/dev/null || [ $((SECONDS - started)) -ge 240 ]; then tail -20 "$OUT/up_$tree.log"; exit 1; fi
    sleep 1
  done
  echo "== $tree serving after $((SECONDS - started)) s"
  for i in 0 1 2; do
    for mode in "\"seed\": $((i + 11))" "\"temperature\": 0.0, \"seed\": 1"; do
      body="{\"input\": \"${texts[$i]}\", \"voice\": \"vivian\", $mode, \"max_new_tokens\": 40, \"min_new_tokens\": 40, \"response_format\": \"pcm\"}"
      sum=$(curl -sf "http://127.0.0.1:$port/v1/audio/speech" -H 'Content-Type: application/json' -d "$body" | sha256sum | cut -c1-16)
      echo "$tree text$i ${mode%%:*} $sum" | tee -a "$OUT/same_audio.txt"
    done
  done
  kill -INT $pid; wait $pid
  cd "$ROOT"
done
