"""The public comparison's plot: voxmesh's open levels (p95 audible first audio by rate) beside the public figures."""

from __future__ import annotations

import pytest

from loadtest.bench.public_plot import main, open_levels, write_public_plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def bench_document(levels: list[tuple[str, float, float | None]]) -> dict:
    return {"meta": {"commit": "abcdef0123"}, "targets": [{"label": "mesh", "levels": [
        {"level": {"mode": mode, "load": load}, "summary": {"first_audible_s": None if p95 is None else {"p95": p95}}}
        for mode, load, p95 in levels]}]}


def test_the_open_levels_are_read_by_rate_in_ms_and_the_closed_ones_left_out():
    document = bench_document([("open", 40.0, 0.042), ("closed", 1, 0.021), ("open", 10.0, 0.033),
                               ("open", 80.0, None)])
    assert open_levels(document) == [(10.0, pytest.approx(33.0)), (40.0, pytest.approx(42.0))]


def test_a_run_with_open_levels_is_drawn_into_a_png(tmp_path):
    out = write_public_plot([("run", bench_document([("open", 10.0, 0.033), ("open", 20.0, 0.035)]))],
                            tmp_path / "plot.png")
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_a_run_without_open_levels_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match="closed-only: the document has no open level"):
        write_public_plot([("closed-only", bench_document([("closed", 1, 0.021)]))], tmp_path / "plot.png")


def test_labels_must_match_the_runs_one_for_one(tmp_path, capsys):
    run = tmp_path / "run.json"
    run.write_text('{"targets": [{"levels": []}]}')
    with pytest.raises(SystemExit):
        main([str(run), str(run), "--label", "one", "--out", str(tmp_path / "p.png")])
    assert "1 labels for 2 runs" in capsys.readouterr().err
