"""`voxmesh bench` for a minute against `voxmesh up --nats-cluster 3`, while the member leading REQUESTS is killed
(SIGKILL) and later started again from the configuration, store and port `up` gave it, the way an operator brings back
a crashed server: every request the bench sent ends exactly once (one end on the client, one terminal event in EVENTS
for every request the mesh accepted), none that the mesh had accepted before the kill fails, and the restarted member
catches up with every stream's leader.

Load: a closed loop of CONCURRENCY clients sending short fixed-length requests for RUN_S seconds (the requests in
flight when the bench's time is up are cut by the bench itself: `client_timeout`). The kill comes with the first
request accepted once ENDED_BEFORE_KILL requests have ended (so one is surely in flight), the restart once
AFTER_KILL requests have ended without the killed member (read from the terminal events, never timed).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats
import pytest

from messages import subjects
from messages.events import Accepted
from messages.streams import CODES_STREAM, EVENTS_STREAM, REQUESTS_STREAM
from services.bus.embedded import EmbeddedNats
from tests.support.mesh import REPO, run_mesh

pytestmark = pytest.mark.timeout(420)

CLUSTER = 3
CONCURRENCY = 2
RUN_S = 60
ENDED_BEFORE_KILL = 30  # requests ended before the kill (the load is steady; a slow machine still gets there early)
FRAMES = 6
AFTER_KILL = 5
MAX_REQUESTS = 100_000  # more than a minute can send: the time limit ends the run
BENCH_TIMEOUT_S = RUN_S + 60.0  # its warm-up, the run, the JSON
CATCH_UP_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 30.0
REPLICATED = (REQUESTS_STREAM, CODES_STREAM, EVENTS_STREAM)


@dataclass(frozen=True)
class Member:
    """One of `up`'s nats-servers, as its command line says (what an operator reads from `ps`)."""

    pid: int
    name: str
    config: Path
    store: Path
    host: str
    port: int

    @classmethod
    def of(cls, pid: int, argv: list[str]) -> Member:
        flag = {argv[i]: argv[i + 1] for i in range(1, len(argv) - 1) if argv[i].startswith("-")}
        return cls(pid, flag["-n"], Path(flag["-c"]), Path(flag["-sd"]), flag["-a"], int(flag["-p"]))

    def restarted(self) -> EmbeddedNats:
        """The same server again: its configuration (routes, users, store key), store, address and client port."""
        server = EmbeddedNats(self.store, port=self.port, name=self.name, config_file=self.config, host=self.host)
        server.start()
        return server


def _members(state: Path) -> dict[str, Member]:
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        if argv and argv[0].endswith("nats-server") and "-sd" in argv and str(state) in argv[argv.index("-sd") + 1]:
            member = Member.of(int(entry.name), argv)
            found[member.name] = member
    return found


def _prompts(path: Path) -> Path:
    lines = [f"p{n}\t{text}" for n, text in enumerate(("One bus, three servers.", "A member falls.",
                                                       "The others keep serving.", "It comes back."))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _bench(gateway_url: str, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "services.cli", "bench", "--url", gateway_url, "--mode", "closed",
               "--concurrency", str(CONCURRENCY), "--requests", str(MAX_REQUESTS), "--fixed-frames",
               str(FRAMES), "--prompts", str(_prompts(tmp_path / "prompts.tsv")), "--level-timeout", str(RUN_S),
               "--request-timeout", str(RUN_S), "--out", str(out), "--no-plot"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               stdin=subprocess.DEVNULL)
    return process, out


class Counter:
    """Counts the messages published on a subject of events as they come, and keeps the request ids they name (a
    plain subscription beside the EVENTS stream: what it has heard is known at once, with no call to the bus)."""

    def __init__(self) -> None:
        self.count = 0
        self.ids: set[str] = set()
        self._grew = asyncio.Condition()

    @classmethod
    async def of(cls, nc, subject: str) -> Counter:
        counter = cls()
        await nc.subscribe(subject, cb=counter._on_message)
        return counter

    async def _on_message(self, msg) -> None:
        async with self._grew:
            self.count += 1
            self.ids.add(msg.subject.split(".")[2])  # tts.events.<request id>.<kind>
            self._grew.notify_all()

    async def reach(self, count: int, timeout_s: float = BENCH_TIMEOUT_S) -> None:
        async with asyncio.timeout(timeout_s), self._grew:
            await self._grew.wait_for(lambda: self.count >= count)


async def _ids_with(js, kind: str) -> dict[str, int]:
    """Per request id, how many `tts.events.<id>.<kind>` messages EVENTS holds (from the stream's leader)."""
    info = await js.stream_info(EVENTS_STREAM, subjects_filter=subjects.events_of_kind(kind))
    return {subject.split(".")[2]: count for subject, count in (info.state.subjects or {}).items()}


async def _every_accepted_ended(js) -> tuple[dict[str, int], dict[str, int]]:
    """EVENTS' accepted and terminal counts per request id, once every accepted request has a terminal event (a
    request the bench cut at its time limit goes on in the mesh for the resume window, and ends there) or the
    deadline has passed."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        accepted, terminal = await _ids_with(js, Accepted.KIND), await _ids_with(js, subjects.TERMINAL_KIND)
        if set(accepted) <= set(terminal) or time.monotonic() > deadline:
            return accepted, terminal
        await asyncio.sleep(0.2)  # the stream's state is polled: a client cannot wait on "every request ended"


async def _leader(js, stream: str) -> str:
    info = await js.stream_info(stream)
    assert info.cluster is not None and info.cluster.leader, info
    return info.cluster.leader


async def _local_last_sequences(http: httpx.AsyncClient) -> dict[str, int]:
    """The last sequence of each stream in one member's own store, from its monitoring's /jsz."""
    jsz = (await http.get("/jsz", params={"accounts": "true", "streams": "true"})).json()
    return {stream["name"]: stream["state"]["last_seq"]
            for account in jsz.get("account_details", []) for stream in account.get("stream_detail", [])}


async def _caught_up(js, member: EmbeddedNats) -> dict[str, tuple[int, int]]:
    """Waits until `member`'s own copy of every replicated stream ends at the leader's last sequence (or the deadline
    passes); returns {stream: (leader's, member's)} as last seen."""
    seen: dict[str, tuple[int, int]] = {}
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    async with httpx.AsyncClient(base_url=member.monitor_url, timeout=5.0) as http:
        while time.monotonic() < deadline:
            local = await _local_last_sequences(http)
            for stream in REPLICATED:
                seen[stream] = ((await js.stream_info(stream)).state.last_seq, local.get(stream, -1))
            if all(lead == own for lead, own in seen.values()):
                return seen
            await asyncio.sleep(0.2)  # the monitoring endpoint is polled: nothing announces a caught-up replica
    return seen


async def test_bench_runs_through_a_member_killed_and_restarted(tiny_checkpoint, tmp_path) -> None:
    state = tmp_path / "state"
    restarted: EmbeddedNats | None = None
    with run_mesh(tiny_checkpoint, state, "--nats-cluster", str(CLUSTER)) as mesh:
        members = _members(state)
        assert len(members) == CLUSTER, mesh.log_tail()
        password = (state / "nats-auth" / "operator.password").read_text().strip()
        urls = [f"nats://{m.host}:{m.port}" for m in members.values()]
        nc = await nats.connect(servers=urls, user="operator", password=password, max_reconnect_attempts=-1)
        bench, out = _bench(mesh.gateway_url, tmp_path)
        try:
            js = nc.jetstream()
            accepted = await Counter.of(nc, subjects.events_of_kind(Accepted.KIND))
            terminals = await Counter.of(nc, subjects.all_terminals())
            await accepted.reach(1)  # the bench's warm-up request: the load starts now
            await terminals.reach(ENDED_BEFORE_KILL)  # a steady load before the fault
            victim = members[await _leader(js, REQUESTS_STREAM)]
            accepted_before_kill = set(await _ids_with(js, Accepted.KIND))  # with any heard before subscribing
            await accepted.reach(accepted.count + 1)  # and a request just accepted, surely in flight
            # No await from here to the kill: a bus call between them gives a short request time to end.
            accepted_before_kill |= accepted.ids
            in_flight_at_kill = accepted.ids - terminals.ids
            os.kill(victim.pid, signal.SIGKILL)
            killed_at, at_kill = time.monotonic(), terminals.count
            await terminals.reach(at_kill + AFTER_KILL)  # requests end while the member is down
            down_s = time.monotonic() - killed_at
            restarted = await asyncio.to_thread(victim.restarted)
            output, _ = await asyncio.to_thread(bench.communicate, timeout=BENCH_TIMEOUT_S)
            assert bench.returncode == 0, output
            accepted_ids, terminal_counts = await _every_accepted_ended(js)
            caught_up = await _caught_up(js, restarted)
        finally:
            if bench.poll() is None:
                bench.kill()
                bench.wait()
            await nc.close()
            try:
                assert mesh.stop() == 0, mesh.log_tail()
            finally:
                if restarted is not None:
                    restarted.stop()
    records = [request for target in json.loads(out.read_text())["targets"] for level in target["levels"]
               for request in level["requests"]]
    assert sorted(r["index"] for r in records) == list(range(len(records))), "a request was lost or ended twice"
    ids = {r["request_id"] for r in records if r["request_id"] is not None}
    assert in_flight_at_kill & ids, "no measured request was in flight at the kill"
    # A request sent while the bus had no leader for REQUESTS may be refused before it was queued (503
    # bus_unavailable, "could not queue the request": its one end, clear, on the client); every other id the bench
    # heard is one the mesh accepted.
    refused = {r["request_id"] for r in records if r["error_code"] == "bus_unavailable"
               and (r["error_message"] or "").startswith("could not queue the request")}
    assert ids - refused <= set(accepted_ids), "the bench heard of a request the mesh never accepted"
    assert not refused & accepted_before_kill, "a request accepted before the kill was refused"
    assert {i: terminal_counts.get(i, 0) for i in accepted_ids if terminal_counts.get(i, 0) != 1} == {}
    failed_early = [r for r in records if r["request_id"] in accepted_before_kill and not r["ok"]]
    assert failed_early == [], failed_early
    cut = [r for r in records if r["error_code"] == "client_timeout"]
    assert len(cut) <= CONCURRENCY, cut  # only the bench's own time limit cuts requests
    assert all(lead == own for lead, own in caught_up.values()), caught_up
    failures = sorted({r["error_code"] for r in records if not r["ok"]} - {"client_timeout"})
    print(f"{len(records)} requests in {RUN_S} s; killed {victim.name} for {down_s:.1f} s with "
          f"{len(in_flight_at_kill)} in flight; {len(cut)} cut at the end; other failures {failures}; caught up "
          f"{caught_up}")
