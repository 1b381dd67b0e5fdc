"""What the gateway measures of the requests it serves (HTTP and WebSocket alike), for its `/metrics`.

Outcomes: `refused` (admission error or full queue: nothing ran), `finished`, `failed` (with the failure's code),
`abandoned` (the client left before the end). First-packet latency runs from admission to the first audio chunk the
gateway holds for the client; RTF is the seconds from admission to the end over the seconds of audio.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from messages.events import Failed, Finished
from messages.requests import SynthesisRequest
from services.gateway.errors import GatewayError
from services.gateway.requests.audio_stream import AudioStream
from services.metrics.live import RequestMetrics


class GatewayMetrics:
    """The gateway's request metrics; `registry` is what `/metrics` renders."""

    def __init__(self) -> None:
        self.live = RequestMetrics()

    @property
    def registry(self):
        return self.live.registry

    def refused(self, error: GatewayError) -> None:
        """A request turned away before it ran (admission, a full queue)."""
        self.live.count("refused", error.code.value)

    def queue_depth(self, depth: int) -> None:
        """Requests on REQUESTS now (set at scrape time)."""
        self.live.queue_depth.set(depth)

    def live_requests(self, count: int) -> None:
        """Requests this gateway holds now (set at scrape time)."""
        self.live.live_requests.set(count)

    @contextlib.contextmanager
    def streaming(self, request: SynthesisRequest, stream: AudioStream) -> Iterator[None]:
        """Around the caller's use of an admitted request's stream: counts it active, then records how it ended."""
        self.live.active_streams.inc()
        try:
            yield
        except GatewayError as error:
            self._ended(request, stream, error)
            raise
        except BaseException:
            self._ended(request, stream, None)
            raise
        else:
            self._ended(request, stream, None)
        finally:
            self.live.active_streams.dec()

    def _ended(self, request: SynthesisRequest, stream: AudioStream, error: GatewayError | None) -> None:
        if stream.first_chunk_at is not None:
            self.live.first_packet.observe(max(0.0, stream.first_chunk_at - request.created_at))
        terminal = stream.terminal
        if error is not None:
            self.live.count("failed", error.code.value)
        elif isinstance(terminal, Failed):
            self.live.count("failed", terminal.code.value)
        elif isinstance(terminal, Finished) and stream.next_seq >= terminal.chunk_count:
            self.live.count("finished")
            if terminal.audio_seconds > 0:
                self.live.rtf.observe(max(0.0, time.time() - request.created_at) / terminal.audio_seconds)
        else:
            self.live.count("abandoned")
