#!/usr/bin/env bash
# Creates .venv with voxmesh, its test extras, and the reference package `qwen-tts` that
# the parity tests use as an oracle. The oracle is installed without its dependencies:
# they pull gradio and a CUDA torchaudio, which the 12 Hz path never touches.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's packages the tests drive: chromium for the web page's browser test (tests/mesh/test_web_page.py, through
# Playwright, which is told never to download a browser of its own); docker.io and debootstrap for the deployment
# test (tests/deploy/test_docker_deploy.py starts a private engine and debootstraps its base image: no image registry).
# kubectl (with kustomize), for the Kubernetes manifests' tests (tests/deploy/test_k8s_*.py), ships on the image.
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "tests/install.sh: ${missing[*]} missing (the browser and deployment tests need them): apt-get install" \
         "${missing[*]}" >&2
  fi
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e '.[test,bench,ucx]'
.venv/bin/pip install -q --disable-pip-version-check \
  transformers==4.57.3 accelerate==1.12.0 librosa==0.11.0 soundfile==0.14.0 einops==0.8.2
.venv/bin/pip install -q --disable-pip-version-check --no-deps qwen-tts==0.1.1
# matplotlib builds its font cache on its first import, running fc-list: build it here, once, so that no test (the unit
# tier starts no process) is the first to import it.
.venv/bin/python -c 'import matplotlib.font_manager'
