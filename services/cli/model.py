"""`voxmesh model`: write a checkpoint with random weights (`init`) or describe one (`info`).

    voxmesh model init --preset tiny|0.6b|1.7b --out DIR [--seed N] [--dtype float32|bfloat16]
                       [--type custom_voice|voice_design|base] [--force] [--no-codec]
    voxmesh model info DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.random_checkpoint.model_presets import PRESETS, TTS_MODEL_TYPES

DTYPE_CHOICES = ("float32", "bfloat16")


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = actions.add_parser("init", help="write a checkpoint with deterministic random weights")
    init.add_argument("--preset", required=True, choices=list(PRESETS), help="model size")
    init.add_argument("--out", required=True, type=Path, help="directory to write (created if missing)")
    init.add_argument("--seed", type=int, default=0, help="weights are a pure function of the seed (default 0)")
    init.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32", help="weight dtype (default float32)")
    init.add_argument("--type", dest="tts_model_type", choices=TTS_MODEL_TYPES, default="custom_voice",
                      help="checkpoint type (default custom_voice)")
    init.add_argument("--force", action="store_true", help="write into a non-empty directory")
    init.add_argument("--no-codec", action="store_true", help="skip speech_tokenizer/ (talker files only)")
    info = actions.add_parser("info", help="print a checkpoint's configuration summary and fingerprint")
    info.add_argument("dir", type=Path, help="checkpoint directory")


def run(args: argparse.Namespace) -> int:
    if args.action == "init":
        return _init(args)
    return _info(args.dir)


def _fail(action: str, error: Exception) -> int:
    code = getattr(error, "code", "error")
    print(f"voxmesh model {action}: error [{code}]: {error}", file=sys.stderr)
    return 1


def _init(args: argparse.Namespace) -> int:
    from services.model.checkpoint_summary import CheckpointInfoError, describe, summarize
    from services.model.text_tokenizer import TokenizerError
    from services.random_checkpoint.checkpoint_writer import CheckpointInitError, write_checkpoint
    from services.random_checkpoint.model_presets import PresetError

    try:
        out = write_checkpoint(
            args.out, args.preset, args.seed, args.dtype, args.tts_model_type,
            overwrite=args.force, with_codec=not args.no_codec, show_progress=None,
        )
        lines = describe(summarize(out))
    except (CheckpointInitError, PresetError, TokenizerError, CheckpointInfoError, OSError) as error:
        return _fail("init", error)
    print(f"wrote a {args.preset} {args.tts_model_type} checkpoint (seed {args.seed}, {args.dtype})")
    print("\n".join(lines))
    return 0


def _info(directory: Path) -> int:
    from services.model.checkpoint_summary import CheckpointInfoError, describe, summarize

    try:
        print("\n".join(describe(summarize(directory))))
    except CheckpointInfoError as error:
        return _fail("info", error)
    return 0
