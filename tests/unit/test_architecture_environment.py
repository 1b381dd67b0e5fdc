"""The environment is read in the few places the allow-list names: settings are declared once (a flag, a variable
and a README row) and passed down, so the model, the engine and the kernels read no variable of their own."""

from __future__ import annotations

from pathlib import Path

from tests.support.architecture import environment_reads

ROOT = Path(__file__).resolve().parents[2]

ALLOWED = {
    "services/runtime/settings_schema.py": "the settings: each declared field's variable (and its _FILE form)",
    "services/mesh/processes.py": "a child process's environment: this process's, then the compose file's",
    "services/mesh/compose_plan.py": "compose interpolation: ${VAR} in the compose files",
    "services/runtime/tracing.py": "OpenTelemetry's own variables (OTEL_TRACES_EXPORTER, the OTLP endpoint...)",
    "services/cli/up.py": "XDG_STATE_HOME: where `voxmesh up` keeps its state; VOXMESH_MODEL_NAME and VOXMESH_REVISION, "
                          "which it settles once for every service (services/mesh/up_model.py); VOXMESH_MAX_STREAMS, "
                          "which --max-num-seqs raises only when the user has not set it",
    "services/bus/embedded.py": "locating nats-server (the variable that names its binary)",
}
"""Module -> why it may read the environment."""


def unlisted_reads(root: Path, allowed: dict[str, str]) -> list[str]:
    """Each environment read under `root`'s services/ and messages/ outside the allowed modules."""
    return [str(finding) for finding in environment_reads(root) if finding.path not in allowed]


def test_only_the_allowed_modules_read_the_environment():
    assert unlisted_reads(ROOT, ALLOWED) == []


def test_every_allowed_module_still_reads_it():
    """An entry whose module stopped reading the environment (or moved) is dropped, not kept as a blank cheque."""
    reading = {finding.path for finding in environment_reads(ROOT)}
    assert sorted(set(ALLOWED) - reading) == []


def test_a_planted_read_is_reported(tmp_path):
    model = tmp_path / "services" / "model"
    model.mkdir(parents=True)
    (model / "switch.py").write_text(
        "import os\nfrom os import getenv\n\n"
        "ON = os.environ.get('VOXMESH_SOMETHING', '1') == '1'\n"
        "def other(environ):\n    return environ.get('X')  # a mapping handed in: no read\n"
        "def copied():\n    return dict(os.environ), os.getenv('Y'), getenv('Z')\n")
    (tmp_path / "messages").mkdir()
    (tmp_path / "messages" / "clean.py").write_text("VALUE = 1\n")
    assert unlisted_reads(tmp_path, ALLOWED) == [
        "services/model/switch.py:2: from os import getenv",
        "services/model/switch.py:4: os.environ",
        "services/model/switch.py:8: os.environ",
        "services/model/switch.py:8: os.getenv",
    ]
    assert unlisted_reads(tmp_path, {**ALLOWED, "services/model/switch.py": "planted"}) == []
