"""`voxmesh say "text" -o out.wav`: synthesize through a running mesh's HTTP API.

`voxmesh say --stdin -o out.wav` (or `-o -` for raw PCM on stdout) streams instead: text in as it is typed, audio
out as it is made (say_stream.py). `--response-format` (by default the output file's suffix: `out.mp3` is mp3) and
`--sample-rate` go into the request as its `response_format` and `sample_rate`; the gateway says the rate it served
in `X-Sample-Rate` (the WebSocket: in `audio.start`), and a rate other than the one asked is an error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import httpx

from services.cli.reference_fields import add_reference_arguments, reference_fields
from services.cli.say_formats import (RAW_FORMATS, RESPONSE_FORMATS, default_rate, format_for_output, given_options,
                                      playback_hint)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="?", default=None, help="what to say (or --stdin)")
    parser.add_argument("--stdin", action="store_true",
                        help="stream: read text from standard input as it arrives; speak each sentence at once")
    parser.add_argument("-o", "--output", type=Path, required=True,
                        help="file to write ('-': standard output)")
    parser.add_argument("--response-format", "--format", dest="format", choices=RESPONSE_FORMATS, default=None,
                        help="the audio's format (default: the output's suffix, .mp3 .flac .opus .aac .pcm .ulaw "
                             ".alaw, else wav; pcm for '-'); with --stdin: wav, pcm (s16le mono), ulaw or alaw")
    parser.add_argument("--sample-rate", type=int, default=None,
                        help="the audio's rate in Hz (default: the format's, 24000; 8000 for ulaw and alaw)")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway (default http://127.0.0.1:8000)")
    parser.add_argument("--model", help="model name as served (default: the one the gateway serves)")
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
    output = None if str(args.output) == "-" else args.output
    response_format = args.format or format_for_output(output)
    body = speech_body(args, response_format)
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
    served = served_rate(response.headers, response_format)
    if args.sample_rate is not None and served != args.sample_rate:
        print(f"voxmesh say: request {request_id}: asked for {args.sample_rate} Hz, the gateway sent {served} Hz",
              file=sys.stderr)
        return 1
    if output is None:
        sys.stdout.buffer.write(response.content)
        sys.stdout.buffer.flush()
    else:
        output.write_bytes(response.content)
    where = "standard output" if output is None else output
    hint = f" (play it: {playback_hint(response_format, served)})" if response_format in RAW_FORMATS else ""
    print(f"request {request_id}: wrote {len(response.content)} bytes of {response_format} at {served} Hz to "
          f"{where}{hint}", file=sys.stderr if output is None else sys.stdout)
    return 0


def speech_body(args: argparse.Namespace, response_format: str) -> dict:
    """The body of `POST /v1/audio/speech` for the one-shot command line."""
    return {"input": args.text, "response_format": response_format, **given_options(args), **reference_fields(args)}


def served_rate(headers: httpx.Headers, response_format: str) -> int:
    """The rate of the answer: its `X-Sample-Rate`, else (a gateway that does not say) the format's default."""
    try:
        return int(headers["x-sample-rate"])
    except (KeyError, ValueError):
        return default_rate(response_format)
