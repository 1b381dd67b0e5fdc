"""`voxmesh say "text" -o out.wav`: synthesize through a running mesh's HTTP API.

`voxmesh say --stdin -o out.wav` (or `-o -` for raw PCM on stdout) streams instead: text in as it is typed, audio
out as it is made (say_stream.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import httpx

from services.cli.reference_fields import add_reference_arguments, reference_fields


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="?", default=None, help="what to say (or --stdin)")
    parser.add_argument("--stdin", action="store_true",
                        help="stream: read text from standard input as it arrives; speak each sentence at once")
    parser.add_argument("-o", "--output", type=Path, required=True,
                        help="WAV file to write; with --stdin, '-' writes the audio to standard output")
    parser.add_argument("--format", choices=("wav", "pcm"), default=None,
                        help="with --stdin: wav or raw s16le 24 kHz mono pcm (default: wav for a file, pcm for '-')")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway (default http://127.0.0.1:8000)")
    parser.add_argument("--model", default="tiny", help="model name as served")
    parser.add_argument("--voice", default=None, help="speaker of the checkpoint (default: the model's first), or a "
                        "base model's saved voice")
    parser.add_argument("--language", default=None, help="'auto' or a language of the checkpoint")
    parser.add_argument("--seed", type=int, default=None, help="fix the seed (reproducible audio)")
    parser.add_argument("--api-key-file", type=Path, default=None, help="file holding an API key (never a flag)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the whole answer")
    add_reference_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.stdin == (args.text is not None):
        print("voxmesh say: give the text as an argument, or --stdin, not both", file=sys.stderr)
        return 2
    if args.stdin:
        from services.cli.say_stream import stream_stdin

        return asyncio.run(stream_stdin(args))
    if str(args.output) == "-" or args.format is not None:
        print("voxmesh say: '-o -' and --format go with --stdin", file=sys.stderr)
        return 2
    body = {"model": args.model, "input": args.text, "response_format": "wav"}
    for key in ("voice", "language", "seed"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    body.update(reference_fields(args))
    headers = {}
    if args.api_key_file is not None:
        headers["Authorization"] = "Bearer " + args.api_key_file.read_text(encoding="utf-8").strip()
    try:
        response = httpx.post(f"{args.url}/v1/audio/speech", json=body, headers=headers, timeout=args.timeout)
    except httpx.TransportError as error:
        print(f"voxmesh say: cannot reach {args.url}: {error}", file=sys.stderr)
        return 1
    request_id = response.headers.get("x-request-id", "?")
    if response.status_code != 200:
        print(f"voxmesh say: request {request_id} failed ({response.status_code}): {response.text}", file=sys.stderr)
        return 1
    args.output.write_bytes(response.content)
    print(f"request {request_id}: wrote {len(response.content)} bytes to {args.output}")
    return 0
