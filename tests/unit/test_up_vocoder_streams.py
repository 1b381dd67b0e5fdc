"""`voxmesh up --max-num-seqs N` sizes the vocoder for decode's batch: a request decode runs beyond the vocoder's
`max_streams` would wait on CODES unvoiced, and its listener would hear a gap."""

from __future__ import annotations

import argparse
from pathlib import Path

from services.cli import up
from services.mesh.up_model import ModelChoice
from services.runtime.model_source import ResolvedModel
from services.runtime.settings_schema import resolve
from services.vocoder.service import VocoderSettings
from services.vocoder.stream_limit import DEFAULT_MAX_STREAMS, streams_for_decode

MODEL = ModelChoice(model_dir="/models/ckpt", revision=None, resolved=ResolvedModel(Path("/models/ckpt"), "ckpt"))


def _overrides(argv: list[str], environ: dict[str, str]) -> dict[str, str]:
    parser = argparse.ArgumentParser()
    up.configure(parser)
    return up._overrides(parser.parse_args(argv), "nats://127.0.0.1:4222", MODEL, None, environ)


def _vocoder_streams(overrides: dict[str, str]) -> int:
    """The limit a vocoder started with these overrides runs with (its settings read from its environment)."""
    return resolve(VocoderSettings, None, dict(overrides, VOXMESH_MODEL_DIR="/models/ckpt")).max_streams


def test_a_batch_above_the_vocoders_default_raises_its_limit_with_it():
    overrides = _overrides(["--max-num-seqs", "256"], {})
    assert overrides["VOXMESH_MAX_NUM_SEQS"] == "256"
    assert _vocoder_streams(overrides) == 256


def test_a_batch_within_the_default_leaves_the_vocoder_as_it_is():
    for argv in ([], ["--max-num-seqs", "32"], ["--max-num-seqs", str(DEFAULT_MAX_STREAMS)]):
        overrides = _overrides(argv, {})
        assert "VOXMESH_MAX_STREAMS" not in overrides, argv
        assert _vocoder_streams(overrides) == DEFAULT_MAX_STREAMS


def test_a_limit_the_user_set_is_kept():
    overrides = _overrides(["--max-num-seqs", "256"], {"VOXMESH_MAX_STREAMS": "96"})
    assert "VOXMESH_MAX_STREAMS" not in overrides  # the child inherits the user's 96 underneath


def test_the_rule():
    assert streams_for_decode(None) is None
    assert streams_for_decode(DEFAULT_MAX_STREAMS) is None
    assert streams_for_decode(DEFAULT_MAX_STREAMS + 1) == DEFAULT_MAX_STREAMS + 1
