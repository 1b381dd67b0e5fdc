"""Locust load test of the gateway's WebSocket stream (`/v1/audio/speech/stream`).

Locust has no WebSocket user; this one speaks the protocol with `websocket-client` and reports three request
types (method "WS"): `first_packet` (time to the first non-empty audio chunk), `stream` (the whole stream, with the
PCM bytes as its response length) and `max_underrun` (the longest wait of a real-time player, in ms).

    locust -f loadtest/bench/locustfile.py --host http://127.0.0.1:8000 --headless -u 8 -r 8 -t 60s \
        --stream-requests 200 --fixed-frames 48 --json-file locust-stats

This is the only module that imports locust: it monkey-patches the standard library with gevent on import.
Flags of its own: --prompts, --voice, --language, --fixed-frames, --stream-requests, --request-timeout,
--allow-remote. Loopback gateways only unless --allow-remote.

The blocking client here (`websocket-client`: Locust's users are greenlets, and gevent makes these sockets
cooperative) feeds the same `StreamRecorder` as the asyncio client of `voxmesh bench`, so both record alike.
"""

from __future__ import annotations

import json
import logging
import sys
from time import perf_counter

import gevent
import websocket
from locust import User, constant, events, task
from locust.exception import StopUser

from loadtest.bench.client import StreamRecorder, TargetError, stream_url
from loadtest.bench.metrics import StreamRecord, request_metrics
from loadtest.bench.workload import DEFAULT_PROMPTS, RequestShape, fixed_sample, load_prompts, prompt_for

log = logging.getLogger("voxmesh.locust")
REQUEST_TYPE = "WS"
_NO_PROXY = ["*"]  # a load test never goes through a proxy from the environment


def stream_request_sync(url: str, payload: dict, *, index: int = 0, prompt_id: str = "", timeout_s: float = 120.0,
                        api_key: str | None = None) -> tuple[StreamRecord, int]:
    """Send `payload` on a new socket to `url` and record the stream; returns (record, PCM bytes received).
    Failures end up in the record's `error`, as with `loadtest.bench.client.stream_request`."""
    recorder = StreamRecorder(index, prompt_id, perf_counter())
    deadline = recorder.started_at + timeout_s
    headers = [f"Authorization: Bearer {api_key}"] if api_key else None
    try:
        socket = websocket.create_connection(url, timeout=timeout_s, header=headers, http_no_proxy=_NO_PROXY,
                                             enable_multithread=False)
    except (websocket.WebSocketException, OSError) as exc:
        recorder.fail("connect_failed", f"cannot open {url}: {exc}", perf_counter())
        return recorder.record(), 0
    try:
        socket.send(json.dumps(payload))
        recorder.mark_sent(perf_counter())
        _receive_until_end(socket, recorder, deadline)
    except websocket.WebSocketTimeoutException:
        recorder.fail("client_timeout", f"no end of stream within {timeout_s:.1f} s", perf_counter())
    except (websocket.WebSocketConnectionClosedException, websocket.WebSocketException, OSError) as exc:
        recorder.fail("connection_closed", f"the socket failed mid-stream: {exc}", perf_counter())
    finally:
        socket.close()
    return recorder.record(), recorder.num_bytes


def _receive_until_end(socket: websocket.WebSocket, recorder: StreamRecorder, deadline: float) -> None:
    while True:
        remaining = deadline - perf_counter()
        if remaining <= 0:
            raise websocket.WebSocketTimeoutException("deadline passed")
        socket.settimeout(remaining)
        opcode, data = socket.recv_data()
        now = perf_counter()
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            recorder.fail("connection_closed", "the gateway closed the socket before audio.done", now)
            return
        message = data.decode("utf-8") if opcode == websocket.ABNF.OPCODE_TEXT else data
        if recorder.on_message(message, now):
            return


@events.init_command_line_parser.add_listener
def _add_flags(parser) -> None:
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="id<TAB>text prompts file")
    parser.add_argument("--voice", default="ryan", help="speaker ('' sends none)")
    parser.add_argument("--language", default="auto")
    parser.add_argument("--fixed-frames", type=int, default=0, help="ignore_eos + max_new_tokens=N (0: natural)")
    parser.add_argument("--stream-requests", type=int, default=0,
                        help="end the run after this many streams (0: only --run-time bounds it)")
    parser.add_argument("--request-timeout", type=float, default=120.0, help="seconds one stream may last")
    parser.add_argument("--allow-remote", action="store_true", help="allow a gateway that is not on loopback")


class _Plan:
    """The run's shared state (greenlets of one process: no locking needed): prompts, URL, request budget."""

    def __init__(self, options) -> None:
        self.url = stream_url(options.host or "http://127.0.0.1:8000", allow_remote=options.allow_remote)
        self.sample = fixed_sample(load_prompts(options.prompts))
        self.shape = RequestShape(voice=options.voice or None, language=options.language,
                                  fixed_frames=options.fixed_frames or None)
        self.timeout_s = options.request_timeout
        self.budget = options.stream_requests or None
        self.num_started = 0
        self.num_ended = 0

    def take(self) -> int | None:
        """The next request's index, or None when the budget is spent."""
        if self.budget is not None and self.num_started >= self.budget:
            return None
        self.num_started += 1
        return self.num_started - 1

    def end(self) -> bool:
        """Count an ended stream; True when it was the budget's last."""
        self.num_ended += 1
        return self.budget is not None and self.num_ended >= self.budget


_plan: _Plan | None = None


@events.init.add_listener
def _plan_run(environment, **_) -> None:
    global _plan
    try:
        _plan = _Plan(environment.parsed_options)
    except (TargetError, ValueError) as error:
        # Refuse before any user starts (a non-loopback host, a bad prompts file): exit like a CLI would.
        print(f"voxmesh locust: {getattr(error, 'code', 'invalid_options')}: {error}", file=sys.stderr)
        sys.exit(2)
    log.info("streaming to %s, %s", _plan.url, _plan.shape.describe_length())


class StreamFailed(Exception):
    """A stream that ended with an error (its code first, for Locust's error table)."""


class SpeechStreamUser(User):
    """Sends streaming requests one after another, each on a new socket."""

    wait_time = constant(0)

    @task
    def stream(self) -> None:
        index = _plan.take()
        if index is None:
            raise StopUser()
        prompt = prompt_for(_plan.sample, index)
        record, num_bytes = stream_request_sync(_plan.url, _plan.shape.payload(prompt.text, index), index=index,
                                                prompt_id=prompt.id, timeout_s=_plan.timeout_s)
        self._report(record, num_bytes)
        if _plan.end():
            log.info("all %d streams done: ending the run", _plan.budget)
            # From a greenlet of its own: the runner's quit stops every user greenlet, this one among them, and
            # called from here it is cut short with it; the run then went on until --run-time.
            gevent.spawn(self.environment.runner.quit)

    def _report(self, record, num_bytes: int) -> None:
        metrics = request_metrics(record)
        failure = None if record.error is None else StreamFailed(f"{record.error.code}: {record.error.message}")
        fire = self.environment.events.request.fire
        if metrics.first_packet_s is not None:
            fire(request_type=REQUEST_TYPE, name="first_packet", response_time=metrics.first_packet_s * 1000.0,
                 response_length=0, exception=None, context={"request_id": record.request_id})
        elif failure is not None:
            fire(request_type=REQUEST_TYPE, name="first_packet", response_time=metrics.latency_s * 1000.0,
                 response_length=0, exception=failure, context={"request_id": record.request_id})
        fire(request_type=REQUEST_TYPE, name="stream", response_time=metrics.latency_s * 1000.0,
             response_length=num_bytes, exception=failure, context={"request_id": record.request_id})
        if failure is None:
            fire(request_type=REQUEST_TYPE, name="max_underrun", response_time=metrics.player.max_underrun_s * 1000.0,
                 response_length=0, exception=None, context={"request_id": record.request_id})
