"""The `voxmesh` command: one subcommand per module in this package.

Each subcommand module defines `configure(parser)` and `run(args) -> int`. Modules are
imported only when their subcommand runs, so `voxmesh --help` stays fast and a
subcommand's heavy imports (torch) cost nothing to the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "model": ("services.cli.model", "write or inspect checkpoints (model init)"),
    "synth": ("services.cli.synth", "synthesize offline, without the bus"),
    "up": ("services.cli.up", "run the whole mesh locally with an embedded NATS server"),
    "serve": ("services.cli.serve", "run one service (gateway, decode, vocoder)"),
    "provision": ("services.cli.provision", "create streams, consumers and the KV bucket"),
    "say": ("services.cli.say", "synthesize through a running mesh"),
    "events": ("services.cli.events", "tail lifecycle events"),
    "bench": ("services.cli.bench", "load-test a running mesh through the streaming API (TTS metrics)"),
    "keys": ("services.cli.keys", "API keys: make a keys-file entry from a secret read on stdin (keys hash)"),
    "usage": ("services.cli.usage", "usage per day, tenant and model, read through a gateway's operator route"),
    "health": ("services.cli.health", "a container's healthcheck: its services answer their own $SRV.PING"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxmesh", description="Streaming TTS serving over NATS.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        build_parser().print_help()
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(SUBCOMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"voxmesh {name}", description=SUBCOMMANDS[name][1])
    module.configure(parser)
    args = parser.parse_args(rest)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
