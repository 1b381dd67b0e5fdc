"""The health records a container's healthcheck reads: written while a service serves, gone when it stops, and a
restarted process's record never removed by its predecessor."""

from services.runtime.health_record import HealthRecord, health_record, read_records


def test_a_record_lives_while_its_service_serves(tmp_path):
    assert read_records(tmp_path / "none") == []
    with health_record(tmp_path, "voxmesh-decode", "ID1", "decode-a"):
        assert read_records(tmp_path) == [HealthRecord("voxmesh-decode", "ID1", "decode-a")]
    assert read_records(tmp_path) == []


def test_a_successors_record_outlives_its_predecessor(tmp_path):
    predecessor = health_record(tmp_path, "voxmesh-vocoder", "OLD", "vocoder-a")
    successor = health_record(tmp_path, "voxmesh-vocoder", "NEW", "vocoder-b")
    predecessor.__enter__()
    successor.__enter__()  # a restarted process overwrites the record
    predecessor.__exit__(None, None, None)  # the old one's late stop leaves the new record alone
    assert read_records(tmp_path) == [HealthRecord("voxmesh-vocoder", "NEW", "vocoder-b")]
    successor.__exit__(None, None, None)
    assert read_records(tmp_path) == []
