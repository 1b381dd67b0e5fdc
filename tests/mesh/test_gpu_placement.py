"""`voxmesh up --gpus SERVICE=I[,J...]`: each replica of a placed service sees one GPU; bad values are refused
before anything starts, naming what is wrong."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.mesh.gpu_placement import PlacementError, parse_placements, replica_environment

SERVICES = ("gateway", "prefill", "decode", "vocoder")


def test_replicas_take_their_indices_in_turn():
    placements = parse_placements(["prefill=1", "decode=0,1"], SERVICES)
    assert placements == {"prefill": (1,), "decode": (0, 1)}
    assert [replica_environment(placements["decode"], k) for k in range(3)] == [
        {"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}, {"CUDA_VISIBLE_DEVICES": "0"}]
    assert replica_environment(placements.get("gateway"), 0) == {}


@pytest.mark.parametrize(("value", "said"), [
    ("decode", "SERVICE=INDEX"), ("decode=", "SERVICE=INDEX"), ("mtp=1", "no service 'mtp'"),
    ("decode=a", "integers >= 0"), ("decode=-1", "integers >= 0"),
])
def test_a_bad_value_is_refused_with_its_reason(value, said):
    with pytest.raises(PlacementError, match=said):
        parse_placements([value], SERVICES)


def test_a_service_named_twice_is_refused():
    with pytest.raises(PlacementError, match="twice"):
        parse_placements(["decode=0", "decode=1"], SERVICES)


def test_voxmesh_up_refuses_a_bad_placement_before_starting_anything(tmp_path):
    done = subprocess.run([sys.executable, "-m", "services.cli", "up", "--state-dir", str(tmp_path / "state"),
                           "--gpus", "prefill=1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "the topology has no service 'prefill'" in done.stderr, done.stderr
    assert not (tmp_path / "state").exists(), "nothing may start, not even the state dir"
