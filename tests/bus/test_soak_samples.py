"""The soak's own parts (loadtest/soak/), short of the soak itself: a process tree read from /proc, the bus read
through the JetStream API of a real nats-server, the GPU read through an `nvidia-smi` (a stand-in script where the
machine has none), and the flatness verdicts on samples made up for the purpose."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys

from loadtest.soak.bus_samples import BusSample, ConsumerSample, StreamSample, sample_bus
from loadtest.soak.flatness import Moment, consumer_verdicts, is_flat, markdown, process_verdicts, stream_verdicts
from loadtest.soak.gpu_samples import CardSample, sample_gpu
from loadtest.soak.process_samples import ProcessSample, mesh_processes, sample_process
from messages import subjects
from messages.streams import BusConfig
from services.bus.connection import connect
from tests.support.nats_server import fresh_bus

MIB = 2**20


async def test_a_process_tree_is_found_and_sampled():
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", "import sys; sys.stdin.read()",
                                                 stdin=asyncio.subprocess.PIPE)
    try:
        found = mesh_processes(os.getpid())
        me = sample_process("up", os.getpid())
    finally:
        child.stdin.close()
        await child.wait()
    assert found["up"] == os.getpid() and child.pid in found.values()
    assert me.rss_bytes > MIB and me.fds >= 3 and me.threads >= 1


async def test_the_bus_sample_has_every_stream_and_durable_consumer(nats_server):
    nc = await connect(nats_server.url, "soak-test", initial_timeout_s=10.0)
    try:
        await fresh_bus(nc.jetstream(), BusConfig(models=("tiny",), num_partitions=2, storage="memory"))
        await nc.jetstream().publish(subjects.event("req_1", "accepted"), b"x", stream="EVENTS")
        sample = await sample_bus(nats_server.url)
    finally:
        await nc.close()
    streams = {stream.name: stream for stream in sample.streams}
    assert {"REQUESTS", "EVENTS", "CODES", "KV_voxmesh"} <= streams.keys()
    assert streams["EVENTS"].messages == 1 and 0 <= streams["EVENTS"].oldest_age_s < 60
    assert streams["EVENTS"].max_age_s == 24 * 3600 and streams["REQUESTS"].max_msgs == 256
    config = BusConfig(models=("tiny",), num_partitions=2)
    assert {c.name for c in sample.consumers} == {spec.durable for spec in config.consumers()}
    assert {"decode-tiny", "decode-tiny-batch-7", "prefill-tiny", "vocoder-p1", "usage"} <= {
        c.name for c in sample.consumers}


def moment(rss_mib: float, fds: int, events: int, events_age_s: float, pending: int = 0) -> Moment:
    processes = {"decode": ProcessSample("decode", 10, int(rss_mib * MIB), fds, 4)}
    streams = [StreamSample("REQUESTS", 0, 0, None, None, 256),
               StreamSample("EVENTS", events, events * 200, events_age_s, 24 * 3600.0, None)]
    bus = BusSample(streams, [ConsumerSample("REQUESTS", "decode-tiny", pending, 0, 0)], 1)
    return Moment(processes, bus, {"gateway_live_requests": 0})


def test_flat_within_five_percent_with_equal_descriptors_and_streams_within_retention():
    start, end = moment(400, 7, events=100, events_age_s=60), moment(412, 7, events=600, events_age_s=660)
    processes, streams = process_verdicts(start, end), stream_verdicts(start, end, requests=100)
    consumers = consumer_verdicts(end)
    assert is_flat(processes, streams, consumers)
    assert processes[0]["rss_change"] == 0.03
    assert next(s for s in streams if s["stream"] == "EVENTS")["messages_per_request"] == 5.0
    run = {"command": "python -m loadtest.soak", "date": "today", "commit": "abc", "duration_s": 600,
           "warmup_s": 60, "concurrency": 4, "fixed_frames": 48, "requests_completed": 100, "requests_failed": 0,
           "requests_cut_off": 4, "requests_per_s": 1.0, "audio_s_per_s": 3.8, "machine": "2 CPUs"}
    table = markdown({"run": run, "flat": True, "processes": processes, "streams": streams, "consumers": consumers})
    assert "| decode | 400.0 MiB -> 412.0 MiB | +3.0% | 7 -> 7 | 4 -> 4 |" in table and "**flat**" in table


def test_growth_a_new_descriptor_old_messages_or_lag_is_not_flat():
    start = moment(400, 7, events=100, events_age_s=60)
    for end in (moment(440, 7, 600, 660), moment(400, 8, 600, 660), moment(400, 7, 600, 25 * 3600),
                moment(400, 7, 600, 660, pending=3)):
        verdicts = (process_verdicts(start, end), stream_verdicts(start, end, 100), consumer_verdicts(end))
        assert not is_flat(*verdicts)


def test_the_broker_is_judged_by_the_streams_it_holds():
    start, end = moment(400, 7, events=100, events_age_s=60), moment(400, 7, events=600, events_age_s=660)
    start.processes["nats-server"] = ProcessSample("nats-server", 11, 30 * MIB, 16, 9)
    end.processes["nats-server"] = ProcessSample("nats-server", 11, 40 * MIB, 15, 9)
    assert is_flat(process_verdicts(start, end), stream_verdicts(start, end, 100), consumer_verdicts(end))
    end.processes["nats-server"] = ProcessSample("nats-server", 12, 30 * MIB, 16, 9)  # restarted
    assert not is_flat(process_verdicts(start, end), stream_verdicts(start, end, 100), consumer_verdicts(end))


FAKE_NVIDIA_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*) printf '0, 61234, 81559\\n' ;;
  --query-compute-apps=*) printf '%s, 58000\\n777, 512\\n' "$DECODE_PID" ;;
  *) echo "unexpected query $1" >&2; exit 6 ;;
esac
"""


async def test_the_gpu_sample_runs_nvidia_smi_and_names_the_mesh_s_pids(tmp_path, monkeypatch):
    assert not (await sample_gpu({"decode": 4121})).available or shutil.which("nvidia-smi")
    fake = tmp_path / "nvidia-smi"
    fake.write_text(FAKE_NVIDIA_SMI)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("DECODE_PID", "4121")
    sample = await sample_gpu({"up": 4100, "decode": 4121})
    assert sample.available and sample.cards == [CardSample(0, 61234, 81559)]
    assert sample.processes == {"decode": 58000} and sample.other_mib == 512 and sample.unmapped_pids == [777]
    fake.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch' >&2\nexit 18\n")
    broken = await sample_gpu({"decode": 4121})
    assert not broken.available and "Driver/library version mismatch" in broken.reason
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert (await sample_gpu({"decode": 4121})).reason == "no GPU: nvidia-smi is not on PATH"
