"""`voxmesh keys hash NAME [--class CLASS]`: a keys-file entry for a secret read on stdin (never from the command
line, where `ps` and shell history would keep it). `voxmesh keys new NAME` makes a fresh secret, prints it once on
stderr and the entry on stdout.

    printf %s "$SECRET" | voxmesh keys hash reader-app --class pro >> keys.toml
"""

from __future__ import annotations

import argparse
import secrets
import sys

from services.gateway.tenancy.keys_file import KeysFileError, entry_text

NEW_SECRET_BYTES = 32


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    for action, help_text in (("hash", "an entry for the secret on stdin (one line; the line break is dropped)"),
                              ("new", "a fresh random secret (on stderr) and its entry (on stdout)")):
        one = sub.add_parser(action, help=help_text)
        one.add_argument("name", help="the key's name: 1..64 of A-Z a-z 0-9 _ - (requests carry it as their tenant)")
        one.add_argument("--class", dest="key_class", default="default",
                         help="the group its metrics are counted under (default: default)")


def run(args: argparse.Namespace) -> int:
    if args.action == "new":
        secret = "vm-" + secrets.token_urlsafe(NEW_SECRET_BYTES)
        print(secret, file=sys.stderr)
    else:
        secret = sys.stdin.readline().rstrip("\r\n")
        if not secret.strip():
            print("voxmesh keys hash: no secret on stdin", file=sys.stderr)
            return 2
    try:
        sys.stdout.write(entry_text(args.name, secret.strip().encode(), args.key_class))
    except KeysFileError as exc:
        print(f"voxmesh keys: {exc}", file=sys.stderr)
        return 2
    return 0
