"""`python -m tests.support.timeline`: each worker's span and busy time, and the files that ended last."""

from tests.support.timeline import summary

LINES = [
    {"worker": "gw0", "nodeid": "tests/mesh/test_a.py::test_one", "start": 100.0, "end": 130.0},
    {"worker": "gw0", "nodeid": "tests/mesh/test_a.py::test_two", "start": 130.0, "end": 150.0},
    {"worker": "gw1", "nodeid": "tests/bus/test_b.py::test_one", "start": 101.0, "end": 190.0},
    {"worker": "gw1", "nodeid": "tests/unit/test_c.py::test_one", "start": 195.0, "end": 200.0},
]


def test_each_worker_s_span_and_busy_time_from_the_first_start():
    rows = summary(LINES).splitlines()
    assert rows[1].split() == ["gw0", "0", "50", "50", "2"]
    assert rows[2].split() == ["gw1", "1", "100", "94", "2"]


def test_the_files_are_listed_by_when_their_last_test_ended():
    listed = summary(LINES, last_files=2).split("files that ended last (start, end, worker):\n")[1].splitlines()
    assert [row.split() for row in listed] == [["1", "90", "gw1", "tests/bus/test_b.py"],
                                               ["95", "100", "gw1", "tests/unit/test_c.py"]]
