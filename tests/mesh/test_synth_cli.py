"""`voxmesh synth`: offline synthesis into a 24 kHz mono s16 WAV and an int64 (frames, 16) codes file, equal to
the model API's own generate; and a clear one-line error, exit status 1, for each bad input."""

from __future__ import annotations

import subprocess
import sys
import wave

import numpy as np
import pytest
import torch

from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from messages.frames import AudioChunk
from services.cli import main
from services.model.codec.loader import load_codec_decoder
from services.model.generate import default_sampling, generate
from services.model.loader import load_model
from services.model.prompt import make_request
from services.model.text_tokenizer import TextTokenizer
from services.random_checkpoint.checkpoint_writer import write_checkpoint

TEXT = "Hello world, this is a test."


def _synth(checkpoint, tmp_path, *extra: str) -> tuple[int, np.ndarray | None]:
    argv = ["synth", "--model", str(checkpoint), "--text", TEXT, "--output", str(tmp_path / "out.wav"),
            "--codes-out", str(tmp_path / "codes.npy"), "--max-new-tokens", "12", *extra]
    status = main(argv)
    return status, np.load(tmp_path / "codes.npy") if status == 0 else None


def _api_codes(checkpoint, greedy: bool, seed: int = 0, **request) -> torch.Tensor:
    model = load_model(checkpoint)
    prompt = make_request(TextTokenizer.from_dir(checkpoint), TEXT, **request)
    return generate(model, prompt, 12, *default_sampling(model.generation, greedy), seed=seed)


def test_greedy_synth_writes_the_wav_and_codes_of_generate(tiny_checkpoint, tmp_path, capsys):
    status, codes = _synth(tiny_checkpoint, tmp_path, "--speaker", "ryan", "--greedy")
    assert status == 0, capsys.readouterr().err
    assert codes.dtype == np.int64 and codes.ndim == 2 and codes.shape[1] == 16 and codes.shape[0] >= 2
    assert np.array_equal(codes, _api_codes(tiny_checkpoint, greedy=True, speaker="ryan").numpy())
    with wave.open(str(tmp_path / "out.wav")) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (SAMPLE_RATE, 1, 2)
        pcm = wav.readframes(wav.getnframes())
    assert len(pcm) == 2 * SAMPLES_PER_FRAME * codes.shape[0]
    decoder = load_codec_decoder(tiny_checkpoint / "speech_tokenizer")
    expected = AudioChunk.from_float(request_id="x", seq=0, first_sample=0, sample_rate=SAMPLE_RATE,
                                     samples=decoder.decode(torch.from_numpy(codes)).numpy()).pcm
    assert pcm == expected
    assert np.abs(np.frombuffer(pcm, dtype="<i2")).max() > 1000, "the audio is silent"
    assert "(greedy)" in capsys.readouterr().out


def test_seeded_synth_is_reproducible_and_matches_generate(tiny_checkpoint, tmp_path):
    _, first = _synth(tiny_checkpoint, tmp_path, "--speaker", "vivian", "--seed", "11")
    _, again = _synth(tiny_checkpoint, tmp_path, "--speaker", "vivian", "--seed", "11")
    assert np.array_equal(first, again)
    assert np.array_equal(first, _api_codes(tiny_checkpoint, greedy=False, seed=11, speaker="vivian").numpy())


def test_streaming_text_mode_and_language(tiny_checkpoint, tmp_path):
    status, codes = _synth(tiny_checkpoint, tmp_path, "--speaker", "eric", "--language", "English",
                           "--text-mode", "streaming", "--greedy")
    assert status == 0
    expected = _api_codes(tiny_checkpoint, greedy=True, speaker="eric", language="English", non_streaming=False)
    assert np.array_equal(codes, expected.numpy())


def test_voice_design_with_an_instruction(tiny_voice_design_checkpoint, tmp_path):
    instruct = "a calm, deep voice"
    status, codes = _synth(tiny_voice_design_checkpoint, tmp_path, "--instruct", instruct, "--greedy")
    assert status == 0
    assert np.array_equal(codes, _api_codes(tiny_voice_design_checkpoint, greedy=True, instruct=instruct).numpy())


def test_the_installed_command_runs(tiny_checkpoint, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "synth", "--model", str(tiny_checkpoint), "--text", "hi there",
         "--speaker", "ryan", "--greedy", "--max-new-tokens", "3", "--output", str(tmp_path / "a.wav")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "a.wav").stat().st_size > 44


@pytest.mark.parametrize(
    "args,message",
    [
        (["--speaker", "mallory"], "unknown speaker 'mallory'; this model knows: eric, ryan, vivian [unknown_speaker]"),
        (["--speaker", "ryan", "--language", "klingon"], "unknown language 'klingon'"),
        (["--speaker", "ryan", "--max-new-tokens", "0"], "--max-new-tokens must be positive"),
    ],
)
def test_bad_request_is_one_clear_line(tiny_checkpoint, tmp_path, capsys, args, message):
    status, _ = _synth(tiny_checkpoint, tmp_path, *args)
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith("voxmesh synth: ") and message in err and "Traceback" not in err


def test_empty_text_is_refused(tiny_checkpoint, tmp_path, capsys):
    status = main(["synth", "--model", str(tiny_checkpoint), "--text", "  ", "--output", str(tmp_path / "o.wav")])
    assert status == 1
    assert "the text is empty" in capsys.readouterr().err
    assert not (tmp_path / "o.wav").exists()


def test_missing_checkpoint_is_named(tmp_path, capsys):
    status = main(["synth", "--model", str(tmp_path / "nowhere"), "--text", TEXT, "--output", str(tmp_path / "o.wav")])
    assert status == 1
    assert f"{tmp_path / 'nowhere' / 'config.json'}: file is missing [bad_checkpoint]" in capsys.readouterr().err


def test_base_checkpoint_is_refused_with_a_reason(tmp_path, capsys):
    base = write_checkpoint(tmp_path / "base", "tiny", seed=0, tts_model_type="base", with_codec=False)
    status = main(["synth", "--model", str(base), "--text", TEXT, "--output", str(tmp_path / "o.wav")])
    assert status == 1
    assert "base (voice-cloning) checkpoint" in capsys.readouterr().err


def test_greedy_and_seed_exclude_each_other(tiny_checkpoint, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["synth", "--model", str(tiny_checkpoint), "--text", TEXT, "--output", str(tmp_path / "o.wav"),
              "--greedy", "--seed", "3"])
    assert exit_info.value.code == 2
