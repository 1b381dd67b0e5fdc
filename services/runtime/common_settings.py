"""Settings every service shares: where the bus is, which model, which device, how to log."""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.model.kernel_choices import KernelChoices
from services.runtime.settings_schema import SettingsError, setting


@dataclass(frozen=True, slots=True)
class CommonSettings:
    """Fields shared by gateway, decode and vocoder; each service's settings class extends this one."""

    nats_url: str = setting("nats://127.0.0.1:4222", "NATS server URL (comma-separated for a cluster)")
    nats_creds_file: str | None = setting(None, "path of a NATS .creds file (user JWT + nkey seed)")
    nats_token: str | None = setting(None, "NATS auth token", secret=True)
    nats_user: str | None = setting(None, "NATS user name (`voxmesh up` and `voxmesh provision --write-nats-auth` "
                                    "make one per service)")
    nats_password: str | None = setting(None, "NATS user's password", secret=True)
    nats_tls_ca_file: str | None = setting(None, "CA certificate (PEM) that signed the NATS server's: set, the "
                                           "connection to NATS is TLS and the server is verified against it")
    nats_tls_cert_file: str | None = setting(None, "this client's certificate (PEM), for a NATS server that "
                                             "verifies its clients (with --nats-tls-key-file)")
    nats_tls_key_file: str | None = setting(None, "the key (PEM) of --nats-tls-cert-file")
    model_dir: str | None = setting(None, "the checkpoint: a directory (voxmesh model init writes one) or a Hugging "
                                    "Face hub id ORG/NAME, found in the hub's cache (HF_HOME; services never "
                                    "download: `voxmesh up` and `voxmesh provision` fetch a missing one first)")
    revision: str | None = setting(None, "a hub id's revision: a branch, a tag or a commit; default: main")
    model_name: str | None = setting(None, "model name clients ask for; slugged into subjects; default: the hub id, "
                                     "or the checkpoint folder's name (a hub cache snapshot's: its id; no "
                                     "checkpoint: tiny)")
    device: str = setting("cpu", "torch device: cpu, cuda, cuda:1 ...")
    dtype: str = setting("float32", "weights dtype", choices=("float32", "bfloat16"))
    replica: str | None = setting(None, "replica name (subject token), unique per process start (a restarted "
                                  "process that reused one would take its dead predecessor's claims for its own); "
                                  "default: <service>-<host>-<pid>-<random incarnation>")
    num_partitions: int = setting(4, "vocoder partitions of the CODES stream (must match provisioning)")
    torch_threads: int = setting(1, "torch intra-op threads for this process")
    event_loop: str = setting("uvloop", "the event loop: uvloop (libuv's; less interpreter time per message, and "
                              "decode's loop publishes every chunk of every stream) or asyncio (the standard "
                              "library's)", choices=("uvloop", "asyncio"))
    switch_interval_ms: float = setting(
        0.5, "the interpreter's thread switch interval (sys.setswitchinterval; Python's default is 5): how long a "
             "thread that wants the interpreter lock waits for one running Python before it is handed over; decode's "
             "engine thread and the vocoder's codec thread wait that long for the event loop, so a short interval "
             "keeps their launches from waiting on it", env="VOXMESH_SWITCH_INTERVAL_MS")
    log_level: str = setting("INFO", "logging level", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    triton_conv: bool = setting(True, "on CUDA, the vocoder's multi-tap convolutions of at most 384 input channels "
                                "run in the Triton kernel (off: cuDNN's); read by the services that load the codec")
    gated_gemm: bool = setting(True, "on CUDA, a decode step's MLP gate/up projection and silu(gate) * up run as one "
                               "Triton kernel (off: the GEMM, then the fused activation); read by the services that "
                               "load the talker")
    health_dir: str | None = setting(None, "directory where each service of this process records its micro service "
                                     "id while it serves; `voxmesh health` asks exactly those (the image sets "
                                     "/tmp/voxmesh-health)")
    device_trace_dir: str | None = setting(None, "set, SIGUSR1 records a window of torch's profiler (every kernel "
                                           "and CPU op of this process) into `DIR/SERVICE-PID.json.gz`, a "
                                           "Chrome trace (loadtest/gpu/device_trace_summary.py sums several up); "
                                           "unset, the signal is not handled")
    device_trace_s: float = setting(5.0, "seconds one SIGUSR1 device-trace window records (with --device-trace-dir)")

    def kernel_choices(self) -> KernelChoices:
        """The code-path switches the model loaders take (read once here, passed down: the model reads no
        environment)."""
        return KernelChoices(triton_conv=self.triton_conv, gated_gemm=self.gated_gemm)


def check_common(settings: CommonSettings) -> None:
    """The shared fields' own limits (each service's __post_init__ checks its fields; these are every service's)."""
    interval = settings.switch_interval_ms
    if not (math.isfinite(interval) and 0.01 <= interval <= 1000):
        raise SettingsError(f"--switch-interval-ms / VOXMESH_SWITCH_INTERVAL_MS: must be between 0.01 and 1000 ms, "
                            f"got {interval}")
    window = settings.device_trace_s
    if not (math.isfinite(window) and 0 < window <= 600):
        raise SettingsError(f"--device-trace-s / VOXMESH_DEVICE_TRACE_S: must be more than 0 and at most 600 s, "
                            f"got {window}")
