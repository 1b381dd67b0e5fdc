"""`voxmesh model init` and `voxmesh model info` through the real command dispatcher."""

from __future__ import annotations

import json

import pytest

from services.cli import main
from services.model.checkpoint_summary import checkpoint_fingerprint


def fingerprint_line(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("fingerprint")).split()[-1]


def test_init_writes_a_checkpoint_and_info_describes_it(tmp_path, capsys):
    out = tmp_path / "tiny"
    assert main(["model", "init", "--preset", "tiny", "--out", str(out), "--seed", "3", "--no-codec"]) == 0
    written = capsys.readouterr().out
    assert "wrote a tiny custom_voice checkpoint (seed 3, float32)" in written
    for name in ("config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
                 "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    assert main(["model", "info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "speakers        eric (sichuan_dialect), ryan, vivian" in info
    assert "talker          hidden 64, layers 2, heads 4:2 x 16, ffn 128, codec vocab 3072" in info
    assert fingerprint_line(info) == fingerprint_line(written) == checkpoint_fingerprint(out)


def test_type_dtype_and_seed_reach_the_files(tmp_path, capsys):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    args = ["--preset", "tiny", "--type", "base", "--dtype", "bfloat16", "--no-codec"]
    assert main(["model", "init", "--out", str(a), "--seed", "1", *args]) == 0
    assert main(["model", "init", "--out", str(b), "--seed", "1", *args]) == 0
    assert main(["model", "init", "--out", str(c), "--seed", "2", *args]) == 0
    config = json.loads((a / "config.json").read_text())
    assert config["tts_model_type"] == "base" and config["dtype"] == "bfloat16"
    assert checkpoint_fingerprint(a) == checkpoint_fingerprint(b) != checkpoint_fingerprint(c)
    assert "weights F32" not in capsys.readouterr().out


def test_a_non_empty_directory_needs_force(tmp_path, capsys):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "other.txt").write_text("x")
    assert main(["model", "init", "--preset", "tiny", "--out", str(out), "--no-codec"]) == 1
    assert "error [out_not_empty]" in capsys.readouterr().err
    assert not (out / "model.safetensors").exists()
    assert main(["model", "init", "--preset", "tiny", "--out", str(out), "--no-codec", "--force"]) == 0
    assert (out / "model.safetensors").is_file()


def test_unknown_preset_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["model", "init", "--preset", "huge", "--out", str(tmp_path / "x")])
    assert info.value.code == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def test_info_on_a_directory_without_a_checkpoint(tmp_path, capsys):
    assert main(["model", "info", str(tmp_path)]) == 1
    assert "error [file_missing]" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    assert main(["model", "info", str(tmp_path)]) == 1
    assert "error [weights_missing]" in capsys.readouterr().err
