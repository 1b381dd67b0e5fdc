"""The gateway's settings: flags, environment variables and the README table come from these declarations."""

from __future__ import annotations

from dataclasses import dataclass

from messages.requests import MAX_TEXT_CHARS
from services.gateway.requests.bus_watch import DEFAULT_BUS_OUTAGE_S
from services.gateway.requests.synthesis import (DEFAULT_CLIENT_BUFFER_S, DEFAULT_MAX_LIVE_REQUESTS,
                                                 DEFAULT_SEGMENT_CHARS)
from services.runtime.common_settings import CommonSettings
from services.runtime.settings_schema import SettingsError, setting


@dataclass(frozen=True, slots=True)
class GatewaySettings(CommonSettings):
    """Settings of `voxmesh serve gateway`."""

    host: str = setting("127.0.0.1", "address the HTTP server binds (loopback by default: put a proxy in front "
                                     "to expose it)")
    port: int = setting(8000, "HTTP port")
    request_deadline_s: float = setting(30.0, "seconds a request may wait in the queue before it fails with "
                                              "code timeout")
    request_timeout_s: float = setting(300.0, "seconds a request may take from admission to its end; past them "
                                              "it is cancelled in every stage and fails with code timeout")
    resume_window_s: float = setting(30.0, "seconds a disconnected client's request lives on before it is "
                                           "cancelled in every stage")
    max_text_chars: int = setting(MAX_TEXT_CHARS, f"longest input text in characters (at most {MAX_TEXT_CHARS})")
    segment_chars: int = setting(DEFAULT_SEGMENT_CHARS, "an HTTP input longer than this is split at sentence "
                                 "ends into ordered requests of at most this many characters (each must fit "
                                 "decode's max_model_len), its audio concatenated")
    max_live_requests: int = setting(DEFAULT_MAX_LIVE_REQUESTS, "requests this gateway holds at once (queued, "
                                     "generating, streaming, awaiting a resume); one more is refused at once with "
                                     "429 too_many_requests and Retry-After")
    client_buffer_s: float = setting(DEFAULT_CLIENT_BUFFER_S, "seconds of a request's audio the gateway holds for a "
                                     "client that reads slower than the mesh makes it; past them the request is "
                                     "cancelled in every stage and fails with code slow_client")
    prefill_min_chars: int = setting(0, "texts at least this long are prefilled on a prefill replica when one is "
                                        "free (remote prefill); 0: decode prefills every prompt")
    prefill_max_queue: int = setting(2, "remote prefill: prompts per live prefill replica that may wait or be "
                                        "prefilled there before the next long prompt is prefilled on decode instead")
    retry_after_s: int = setting(1, "Retry-After seconds sent with a 429 (the request queue full, or "
                                    "--max-live-requests reached)")
    vocoder_grace_s: float = setting(5.0, "seconds a partition may lack a live vocoder before its requests fail "
                                          "with code replica_lost")
    supervise_interval_s: float = setting(0.5, "seconds between supervision passes (deadlines, vocoder leases, "
                                               "resume windows)")
    bus_outage_s: float = setting(DEFAULT_BUS_OUTAGE_S, "seconds a streaming request may go with neither audio nor "
                                  "an answer from the bus's EVENTS stream (this gateway's NATS server cut off from "
                                  "the cluster, or down); past them its client's stream ends with code "
                                  "bus_unavailable (the request itself may still finish and be resumed elsewhere)")
    redecode_timeout_s: float = setting(5.0, "seconds to wait for a re-decoded chunk before asking again")
    drain_timeout_s: float = setting(10.0, "seconds in-flight responses get to finish on shutdown")
    api_keys: str | None = setting(None, "API keys, comma-separated; when set, /v1 calls and the WebSocket (the "
                                         "web page's stream too) need Authorization: Bearer <key>", secret=True)
    keys_file: str | None = setting(None, "keys file (TOML): named API keys, each as the SHA-256 of its secret, "
                                          "with its limits (requests per second and burst, live requests, audio "
                                          "seconds per UTC day), priority and metrics class; read again within a "
                                          "second of a change (a bad edit keeps the keys in force); its "
                                          "[defaults] limit the keys of VOXMESH_API_KEYS too, and the anonymous tenant "
                                          "when no key is set")
    admin_api_keys: str | None = setting(None, "operator keys, comma-separated, apart from the client keys: when "
                                               "set, /metrics needs one of them (a client key does not open it); "
                                               "unset, /metrics needs a client key when client keys are set",
                                         secret=True)

    tls_cert_file: str | None = setting(None, "certificate chain (PEM) the HTTP server presents: set (with "
                                              "--tls-key-file), the gateway serves HTTPS and WSS only")
    tls_key_file: str | None = setting(None, "the private key (PEM) of --tls-cert-file")

    resume_secret: str | None = setting(None, "secret (16 characters or more) under which gateways sign the "
                                              "WebSocket's resume tokens; every gateway of a mesh needs the same "
                                              "one so any can verify a resume (`voxmesh up` makes one); unset: a "
                                              "random one per process, resumes verify on that gateway only",
                                        secret=True)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"--port / VOXMESH_PORT: {self.port} is not a TCP port (0..65535)")
        if self.prefill_min_chars < 0 or self.prefill_max_queue < 1:
            raise SettingsError(f"--prefill-min-chars ({self.prefill_min_chars}) must be >= 0 and --prefill-max-queue "
                                f"({self.prefill_max_queue}) >= 1")
        if self.segment_chars < 1:
            raise SettingsError(f"--segment-chars / VOXMESH_SEGMENT_CHARS: {self.segment_chars} must be >= 1")
        if not 1 <= self.max_text_chars <= MAX_TEXT_CHARS:
            raise SettingsError(f"--max-text-chars / VOXMESH_MAX_TEXT_CHARS: {self.max_text_chars} must be in "
                                f"1..{MAX_TEXT_CHARS}")
        if self.max_live_requests < 1:
            raise SettingsError(f"--max-live-requests / VOXMESH_MAX_LIVE_REQUESTS: {self.max_live_requests} must be "
                                ">= 1")
        if self.num_partitions < 1:
            raise SettingsError(f"--num-partitions / VOXMESH_NUM_PARTITIONS: {self.num_partitions} must be >= 1")
        for name in ("request_deadline_s", "request_timeout_s", "resume_window_s", "vocoder_grace_s", "supervise_interval_s",
                     "redecode_timeout_s", "drain_timeout_s", "client_buffer_s", "bus_outage_s"):
            if getattr(self, name) <= 0:
                flag = "--" + name.replace("_", "-")
                raise SettingsError(f"{flag} / VOXMESH_{name.upper()}: must be > 0, got {getattr(self, name)}")
        if self.resume_secret is not None and len(self.resume_secret.encode()) < 16:
            raise SettingsError("VOXMESH_RESUME_SECRET: needs 16 characters or more")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise SettingsError("--tls-cert-file / VOXMESH_TLS_CERT_FILE and --tls-key-file / VOXMESH_TLS_KEY_FILE: "
                                "set both (HTTPS) or neither (HTTP)")
        if self.retry_after_s < 0:
            raise SettingsError(f"--retry-after-s / VOXMESH_RETRY_AFTER_S: must be >= 0, got {self.retry_after_s}")
