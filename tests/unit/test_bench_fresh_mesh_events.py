"""The fresh mesh's events URL: read from `voxmesh up`'s serving line and the observer's password file."""

from __future__ import annotations

from loadtest.bench.client import redacted
from loadtest.bench.fresh_mesh import observer_events_url

LINE = ("voxmesh is serving: http://127.0.0.1:26803  (NATS nats://127.0.0.1:35977, monitoring http://127.0.0.1:40105, "
        "users in {users}, topology single, model 'tiny': /tmp/ckpt)")


def test_the_observer_reads_the_embedded_bus_with_its_password_quoted(tmp_path):
    (tmp_path / "observer.password").write_text("a/b:c@d%e\n")
    url = observer_events_url(LINE.format(users=tmp_path))
    assert url == "nats://observer:a%2Fb%3Ac%40d%25e@127.0.0.1:35977"
    assert redacted(url) == "nats://observer:***@127.0.0.1:35977", "reports never carry the password"


def test_a_cluster_line_names_its_first_member(tmp_path):
    (tmp_path / "observer.password").write_text("secret")
    line = LINE.format(users=tmp_path).replace("nats://127.0.0.1:35977", "nats://127.0.0.1:1,nats://127.0.0.1:2")
    line = line.replace(", topology", ", a JetStream cluster of 3, topology")
    assert observer_events_url(line) == "nats://observer:secret@127.0.0.1:1"


def test_no_breakdown_without_an_embedded_bus_or_an_observer(tmp_path):
    outside = "voxmesh is serving: http://127.0.0.1:8000  (NATS nats://10.0.0.1:4222, topology single, model x)"
    assert observer_events_url(outside) is None
    assert observer_events_url(LINE.format(users=tmp_path)) is None, "no observer.password in the folder"


def test_a_mesh_under_cuda_mps_is_read_the_same(tmp_path):
    """`voxmesh up --cuda-mps` adds its daemon's pipe folder after the users' folder in the serving line."""
    (tmp_path / "observer.password").write_text("secret")
    line = LINE.format(users=tmp_path).replace(", topology", f", CUDA MPS on {tmp_path}/cuda-mps/pipe, topology")
    assert observer_events_url(line) == "nats://observer:secret@127.0.0.1:35977"
