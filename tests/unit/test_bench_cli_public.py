"""`voxmesh bench`'s flags for the public method: what they build and the combinations it refuses."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loadtest.bench.client import TargetError
from loadtest.bench.fresh_mesh import MeshLauncher, MeshStartError
from loadtest.bench.http_speech import STREAMED_PCM_FIELDS, speech_body
from loadtest.bench.sweep import BenchError
from loadtest.bench.workload import LoadError
from services.cli import bench as bench_cli


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_cli.configure(parser)
    return parser.parse_args(list(argv))


def test_the_public_method_flags_build_an_http_sweep_with_a_gate():
    config = bench_cli.build_config(parse("--transport", "http", "--mode", "open", "--sweep", "--rate-ladder", "1",
                                          "4", "2", "--p95-bound-ms", "50"))
    (target,) = config.targets
    assert (target.transport, target.url) == ("http", "http://127.0.0.1:8000/v1/audio/speech")
    assert [level.load for level in config.levels] == [1.0, 2.0, 4.0]
    assert config.sweep and config.gate.p95_first_audible_bound_s == pytest.approx(0.05)
    assert bench_cli.build_config(parse()).targets[0].url == "ws://127.0.0.1:8000/v1/audio/speech/stream"


def test_the_http_body_adds_only_the_fields_the_gateway_accepts():
    assert STREAMED_PCM_FIELDS == {"stream": True, "response_format": "pcm", "stream_format": "audio"}
    assert speech_body({"input": "x", "seed": 1}) == {"input": "x", "seed": 1, **STREAMED_PCM_FIELDS}


@pytest.mark.parametrize(("argv", "error"), [
    (("--sweep",), LoadError),  # --mode both
    (("--fresh-mesh", "--url", "http://127.0.0.1:9"), LoadError),
    (("--up-args=--device cpu",), LoadError),
    (("--mode", "open", "--sweep", "--compare-url", "http://127.0.0.1:9"), BenchError),
])
def test_contradicting_flags_are_refused(argv, error):
    with pytest.raises(error):
        args = parse(*argv)
        bench_cli.build_config(args)
        bench_cli.build_launcher(args)


def test_the_fresh_mesh_owns_its_port_and_state_dir():
    launcher = bench_cli.build_launcher(parse("--fresh-mesh", "--up-args=--model ./ckpt --device cuda"))
    command = launcher.command(20001, Path("/tmp/state"))
    assert command[-8:] == ["--port", "20001", "--state-dir", "/tmp/state", "--model", "./ckpt", "--device", "cuda"]
    for owned in (("--port", "1"), ("--state-dir=/x",)):
        with pytest.raises(MeshStartError) as refused:
            MeshLauncher(up_args=owned)
        assert refused.value.code == "invalid_up_args"



def test_the_api_key_comes_from_the_variable_or_its_file_never_a_flag(tmp_path, monkeypatch):
    monkeypatch.delenv("VOXMESH_API_KEY", raising=False)
    monkeypatch.delenv("VOXMESH_API_KEY_FILE", raising=False)
    assert bench_cli.build_config(parse()).api_key is None
    key_file = tmp_path / "key"
    key_file.write_text("k-from-file\n")
    monkeypatch.setenv("VOXMESH_API_KEY_FILE", str(key_file))
    assert bench_cli.build_config(parse()).api_key == "k-from-file"
    monkeypatch.setenv("VOXMESH_API_KEY", "k-from-variable")
    assert bench_cli.build_config(parse()).api_key == "k-from-variable"
    with pytest.raises(SystemExit):  # a key on the command line would show in `ps` and in the report's command
        parse("--api-key", "k")


def test_an_unreadable_key_file_is_refused_with_its_code(tmp_path, monkeypatch):
    monkeypatch.delenv("VOXMESH_API_KEY", raising=False)
    monkeypatch.setenv("VOXMESH_API_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(TargetError) as refused:
        bench_cli.build_config(parse())
    assert refused.value.code == "unreadable_api_key"
