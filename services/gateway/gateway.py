"""The gateway's running parts, built once connected: the synthesizer (admission, streaming, repair), the
supervisor, the served model's catalog and the API keys. The service lifecycle owns the connection, the lease and
the tasks; the routes get these parts through the app (`create_app(gateway)`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from messages.key_limits import LIMITS_BUCKET
from services.bus.provision import open_bucket
from services.gateway.http.auth import parse_keys
from services.gateway.requests.bus_watch import BusOutagePolicy
from services.gateway.requests.catalog import VoiceCatalog
from services.gateway.requests.prefill_route import PrefillRoute
from services.gateway.requests.repair import RepairPolicy
from services.gateway.requests.supervisor import Supervisor, SupervisorPolicy
from services.gateway.requests.synthesis import Synthesizer
from services.gateway.requests.terminal_feed import TerminalFeed
from services.gateway.requests.validation import AdmissionPolicy
from services.gateway.settings import GatewaySettings
from services.gateway.tenancy.gate import TenantGate
from services.gateway.tenancy.key_metrics import KeyClassMetrics
from services.gateway.tenancy.keyring import Keyring
from services.gateway.tenancy.shared_limits import SharedLimits
from services.gateway.voices.voice_store import VoiceStore
from services.gateway.ws.resume_token import ResumeTokens
from services.runtime.lifecycle import ServiceContext


@dataclass(slots=True)
class Gateway:
    """What the routes use.

    Attributes:
        synthesizer: starts requests and streams their audio.
        catalog: the served model, voices and languages.
        keyring: the accepted client keys and the tenant of each (none: one anonymous tenant, no authentication).
        replica: this gateway's replica name.
        admin_keys: the operator's keys (empty: the operator's routes take the client keys).
        resume_tokens: issues and checks the WebSocket's resume tokens (one secret for every gateway of a mesh).
    """

    synthesizer: Synthesizer
    catalog: VoiceCatalog
    keyring: Keyring
    replica: str
    admin_keys: tuple[bytes, ...] = ()
    resume_tokens: ResumeTokens = field(default_factory=ResumeTokens.random)



async def build_gateway(settings: GatewaySettings, catalog: VoiceCatalog, context: ServiceContext) -> Gateway:
    """The gateway's parts on the service's connection (its supervisor runs as a task of the service). Raises
    KeysFileError when the keys file cannot be used, NotProvisioned when the limits bucket is missing."""
    keyring = Keyring(parse_keys(settings.api_keys), Path(settings.keys_file) if settings.keys_file else None)
    policy = SupervisorPolicy(check_interval_s=settings.supervise_interval_s,
                              vocoder_grace_s=settings.vocoder_grace_s, resume_window_s=settings.resume_window_s,
                              request_timeout_s=settings.request_timeout_s)
    supervisor = Supervisor(context.nc, context.js, context.kv, catalog.model, TerminalFeed(context.js), policy)
    synthesizer = Synthesizer(context.nc, context.js, context.kv,
                              AdmissionPolicy(catalog, settings.max_text_chars, settings.request_deadline_s),
                              supervisor, settings.num_partitions,
                              RepairPolicy(arrival_timeout_s=settings.redecode_timeout_s), settings.retry_after_s,
                              segment_chars=settings.segment_chars, max_live_requests=settings.max_live_requests,
                              client_buffer_s=settings.client_buffer_s,
                              outage=BusOutagePolicy(settings.bus_outage_s),
                              voices=VoiceStore(context.nc, context.js, catalog.model),
                              prefill_route=PrefillRoute(context.js, context.kv, catalog.model, settings.prefill_min_chars,
                                                         settings.prefill_max_queue))
    limits = SharedLimits(await open_bucket(context.js, LIMITS_BUCKET), context.kv, context.replica)
    synthesizer.gate = TenantGate(limits, KeyClassMetrics(synthesizer.metrics.registry))
    supervisor.terminals.listen(synthesizer.gate.on_terminal)
    tokens = ResumeTokens(settings.resume_secret.encode()) if settings.resume_secret else ResumeTokens.random()
    return Gateway(synthesizer, catalog, keyring, context.replica, parse_keys(settings.admin_api_keys), tokens)
