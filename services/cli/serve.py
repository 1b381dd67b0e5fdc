"""`voxmesh serve NAME [flags]`: run one service in this process (same as `python -m services.NAME`)."""

from __future__ import annotations

import argparse

from services.runtime import process


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("service", choices=process.SERVICES + process.COMPOSITES,
                        help="which service to run (colocated: decode and the vocoder in one process)")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="the service's own flags (see voxmesh serve NAME --help)")


def run(args: argparse.Namespace) -> int:
    return process.main(args.service, args.flags)
