"""The voice-cloning fields of `voxmesh say` (base models): a reference recording as the API's `ref_audio` data URI,
its transcript, x-vector-only mode. Shared by the one-shot request and the streaming session."""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

MEDIA_TYPES = {".wav": "audio/wav", ".flac": "audio/flac", ".ogg": "audio/ogg", ".mp3": "audio/mpeg"}


def add_reference_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ref-audio", type=Path, default=None,
                        help="base models: the voice to clone, an audio file of 1-30 s (WAV, FLAC, OGG, MP3)")
    parser.add_argument("--ref-text", default=None, help="the transcript of --ref-audio (in-context cloning)")
    parser.add_argument("--x-vector-only", action="store_true",
                        help="clone from the speaker embedding alone (no --ref-text needed)")


def reference_fields(args: argparse.Namespace) -> dict:
    """The body fields the arguments set (none without --ref-audio)."""
    if args.ref_audio is None:
        return {}
    media_type = MEDIA_TYPES.get(args.ref_audio.suffix.lower(), "audio/wav")
    fields = {"ref_audio": f"data:{media_type};base64,{base64.b64encode(args.ref_audio.read_bytes()).decode()}"}
    if args.ref_text is not None:
        fields["ref_text"] = args.ref_text
    if args.x_vector_only:
        fields["x_vector_only_mode"] = True
    return fields
