"""The vocoder's pure parts: which stored codes count, partition settings and shares, the stream table."""

from __future__ import annotations

import numpy as np
import pytest

from messages.base import ErrorInfo
from messages.errors import ErrorCode, Stage
from messages.frames import CodesChunk, CodesEnd, TakeoverMarker
from services.runtime.settings_schema import SettingsError, resolve
from services.bus.codes_record import StoredCodes, effective_codes
from services.vocoder.partition_share import HandoffPause, PartitionView, UnservedClock, share_of
from services.vocoder.partitions import parse_partitions
from services.vocoder.request_streams import RequestStream, StreamTable
from services.vocoder.service import VocoderSettings

RID = "req-unit"


def chunk(seq: int, epoch: int, value: int = 0) -> CodesChunk:
    return CodesChunk.from_frames(request_id=RID, seq=seq, first_frame=2 * seq, epoch=epoch,
                                  frames=np.full((2, 16), value))


def marker(epoch: int, replica: str, next_seq: int) -> TakeoverMarker:
    return TakeoverMarker(request_id=RID, epoch=epoch, replica=replica, resume_frame=2 * next_seq, next_seq=next_seq)


def stored(*messages) -> list[StoredCodes]:
    return [StoredCodes(n + 1, m) for n, m in enumerate(messages)]


def test_effective_codes_drop_stale_epochs_and_repeats_and_keep_the_newest_owner():
    end = CodesEnd(request_id=RID, seq=3, epoch=2, reason="finished", total_frames=6, stop="eos")
    record = effective_codes(stored(
        marker(1, "decode-a", 0), chunk(0, 1), chunk(1, 1), chunk(1, 1),  # a plain retry of seq 1
        marker(2, "decode-b", 2), chunk(2, 1, value=9),  # the old owner, too late
        chunk(2, 2, value=5), end))
    assert [(c.message.seq, c.message.epoch) for c in record.chunks] == [(0, 1), (1, 1), (2, 2)]
    assert int(record.chunks[2].message.frames()[0, 0]) == 5
    assert [c.stream_seq for c in record.chunks] == [2, 3, 7]
    assert (record.epoch, record.owner, record.end) == (2, "decode-b", end)


def test_effective_codes_stop_at_a_hole_and_ignore_a_stale_end():
    failed = CodesEnd(request_id=RID, seq=1, epoch=1, reason="failed", total_frames=2,
                      error=ErrorInfo(code=ErrorCode.REPLICA_LOST, stage=Stage.DECODE, message="x"))
    record = effective_codes(stored(marker(1, "a", 0), chunk(0, 1), marker(2, "b", 1), failed, chunk(2, 2)))
    assert [c.message.seq for c in record.chunks] == [0], "seq 1 is missing: nothing after it counts"
    assert record.end is None, "a CodesEnd from the replaced owner does not end the request"


def test_parse_partitions():
    assert parse_partitions("all", 4) == (0, 1, 2, 3)
    assert parse_partitions(" 2, 0 ,2", 4) == (0, 2)
    for bad, words in (("0,x", "comma-separated"), ("4", "outside 0..3"), (",", "at least one")):
        with pytest.raises(SettingsError, match=words):
            parse_partitions(bad, 4)


def test_live_vocoders_split_the_partitions_evenly_by_name():
    assert [share_of(r, ("a",), 4) for r in "a"] == [4]
    assert [share_of(r, ("a", "b"), 4) for r in "ab"] == [2, 2]
    assert [share_of(r, ("a", "b", "c"), 4) for r in "abc"] == [2, 1, 1]
    assert [share_of(r, ("a", "b", "c", "d", "e"), 4) for r in "abcde"] == [1, 1, 1, 1, 0]


def test_a_partition_view_sees_unserved_partitions_and_short_vocoders():
    view = PartitionView("a", ("a", "b"), 4, {0: "a", 1: "a", 2: "a", 3: None})
    assert (view.share(), view.held_by("a"), view.unserved(), view.someone_short()) == (2, 3, [3], True)
    settled = PartitionView("a", ("a", "b"), 4, {0: "a", 1: "a", 2: "b", 3: "b"})
    assert (settled.unserved(), settled.someone_short()) == ([], False)


def test_an_unserved_partition_is_overdue_after_the_patience_and_forgotten_once_served():
    clock = UnservedClock(patience_s=3.0)
    clock.observe([1, 2], now=10.0)
    clock.observe([1, 2], now=12.0)
    assert not clock.is_overdue(1, now=12.9)
    assert clock.is_overdue(1, now=13.0) and not clock.is_overdue(0, now=13.0)
    clock.observe([2], now=13.0)  # partition 1 was served meanwhile: its clock starts again next time
    clock.observe([1, 2], now=14.0)
    assert not clock.is_overdue(1, now=16.0) and clock.is_overdue(2, now=16.0)


def test_hand_offs_pause_longer_each_time_with_the_same_vocoders_and_resume_when_they_change():
    pause = HandoffPause(base_s=30.0, max_s=100.0)
    live = ("a", "b")
    assert not pause.is_paused(live, now=0.0)
    pause.start(live, now=0.0)
    assert pause.is_paused(live, now=29.0) and not pause.is_paused(live, now=30.0)
    assert not pause.is_paused(("a", "b", "c"), now=1.0), "a new vocoder may take partitions"
    pause.start(live, now=40.0)
    assert pause.is_paused(live, now=99.0) and not pause.is_paused(live, now=100.0)
    pause.start(live, now=100.0)
    assert pause.is_paused(live, now=199.0) and not pause.is_paused(live, now=200.0), "capped at max_s"


def test_settings_from_environment_are_validated():
    settings = resolve(VocoderSettings, environ={"VOXMESH_PARTITIONS": "1", "VOXMESH_MAX_STREAMS": "8",
                                                 "VOXMESH_CODEC_BATCHING": "off", "VOXMESH_REPLICA": "voc-1"})
    config = settings.replica_config()
    assert (config.partitions, config.max_streams, config.replica) == ((1,), 8, "voc-1")
    assert settings.codec_batching is False
    with pytest.raises(SettingsError, match="--max-streams"):
        resolve(VocoderSettings, environ={"VOXMESH_MAX_STREAMS": "0"})
    with pytest.raises(SettingsError, match="--tick-s"):
        resolve(VocoderSettings, environ={"VOXMESH_TICK_S": "5", "VOXMESH_LEASE_TTL_S": "3"})
    with pytest.raises(SettingsError, match="outside"):
        resolve(VocoderSettings, environ={"VOXMESH_PARTITIONS": "7"})
    assert resolve(VocoderSettings, environ={"VOXMESH_CODEC_HOLD_MS": "0"}).codec_hold_ms == 0.0
    for held in ("-1", "nan", "5000"):
        with pytest.raises(SettingsError, match="--codec-hold-ms: must be between 0 and 1000"):
            resolve(VocoderSettings, environ={"VOXMESH_CODEC_HOLD_MS": held})


def test_stream_table_bounds_and_remembers_ended_requests():
    table = StreamTable(max_streams=1, remember_ended=2)
    table.add(RequestStream("a", 0, codec_state=None))
    assert table.is_full()
    with pytest.raises(KeyError):
        table.add(RequestStream("a", 0, codec_state=None))
    table.release("a", ended=True)
    assert not table.is_full() and table.has_ended("a")
    table.add(RequestStream("b", 1, codec_state=None))
    table.release("b", ended=False)  # a lost partition: another vocoder goes on with it
    assert not table.has_ended("b")
    for rid in ("c", "d"):
        table.add(RequestStream(rid, 0, codec_state=None))
        table.release(rid, ended=True)
    assert not table.has_ended("a") and table.has_ended("d"), "only the most recent ended ids are kept"


def test_stream_epochs_only_move_forward():
    stream = RequestStream(RID, 0, codec_state=None)
    stream.note_epoch(2, "decode-b")
    stream.note_epoch(1, "decode-a")
    assert (stream.epoch, stream.owner) == (2, "decode-b")
    assert stream.is_stale(1) and not stream.is_stale(2)
    stream.advance(chunk(0, 2))
    assert (stream.next_seq, stream.frames) == (1, 2)


def test_only_a_checkpoint_that_clones_voices_prepares_the_priming_passes(tiny_checkpoint, tiny_base_checkpoint,
                                                                             tmp_path, caplog):
    from services.vocoder.service import clones_voices

    def settings(model_dir) -> VocoderSettings:
        return VocoderSettings(nats_url="nats://127.0.0.1:4222", model_dir=str(model_dir), replica="vocoder-unit")

    assert clones_voices(settings(tiny_base_checkpoint)) is True
    assert clones_voices(settings(tiny_checkpoint)) is False
    # A directory whose config cannot be read prepares them, and says why.
    (tmp_path / "config.json").write_text("{not json")
    assert clones_voices(settings(tmp_path)) is True
    assert "could not read the checkpoint's model type" in caplog.text
