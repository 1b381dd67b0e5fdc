"""`voxmesh usage`: requests, characters, audio seconds and errors per UTC day, tenant and model, as a gateway's
operator route `GET /admin/usage` sums them from the bus (every gateway's requests, each once).

The operator key is read as the services read their secrets: `VOXMESH_ADMIN_API_KEY`, or the file that
`VOXMESH_ADMIN_API_KEY_FILE` names; never a flag (`ps` would show it). A gateway without operator keys takes a client
key there. Exit 0: printed; 1: the gateway refused or could not answer; 2: misconfigured.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import httpx

from services.runtime.settings_schema import SettingsError, resolve, setting

DEFAULT_URL = "http://127.0.0.1:8000"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
COLUMNS = ("day", "tenant", "model", "requests", "characters", "audio_seconds", "errors")


@dataclass(frozen=True, slots=True)
class UsageCredentials:
    """What `voxmesh usage` presents to the gateway."""

    admin_api_key: str | None = setting(None, "an operator key of the gateway (a client key when it has none), "
                                              "sent as a bearer token", secret=True)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the gateway (default {DEFAULT_URL})")
    parser.add_argument("--from", dest="start", help="ISO 8601 date or time, UTC unless it says otherwise "
                                                     "(default: the start of this UTC month)")
    parser.add_argument("--to", dest="end", help="exclusive end, ISO 8601 (default: now)")
    parser.add_argument("--tenant", help="one tenant only (the API key's name; \"\" is the anonymous tenant)")
    parser.add_argument("--model", help="one model only")
    parser.add_argument("--json", action="store_true", help="print the gateway's JSON answer instead of a table")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the answer (default 90)")


def run(args: argparse.Namespace) -> int:
    try:
        key = resolve(UsageCredentials).admin_api_key
    except SettingsError as error:
        print(f"voxmesh usage: {error}", file=sys.stderr)
        return EXIT_USAGE
    params = {name: value for name, value in (("from", args.start), ("to", args.end), ("tenant", args.tenant),
                                              ("model", args.model)) if value is not None}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.get(f"{args.url.rstrip('/')}/admin/usage", params=params, headers=headers,
                             timeout=args.timeout)
    except httpx.HTTPError as error:
        print(f"voxmesh usage: cannot reach {args.url}: {error!r}", file=sys.stderr)
        return EXIT_FAILED
    if response.status_code != 200:
        print(f"voxmesh usage: {args.url} answered {response.status_code}: {response.text}", file=sys.stderr)
        return EXIT_FAILED
    answer = response.json()
    print(json.dumps(answer, indent=2) if args.json else usage_table(answer))
    return EXIT_OK


def usage_table(answer: dict) -> str:
    """The answer of /admin/usage as a fixed-width table, the total last."""
    lines = [[_cell(name, row[name]) for name in COLUMNS] for row in (*answer["rows"], answer["total"])]
    header = [name.replace("_", " ") for name in COLUMNS]
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines)]
    return "\n".join("  ".join(cell.ljust(width) if index < 3 else cell.rjust(width)
                               for index, (cell, width) in enumerate(zip(line, widths)))
                     for line in (header, *lines))


def _cell(name: str, value: object) -> str:
    if name == "audio_seconds":
        return f"{value:.2f}"
    if name == "tenant" and value == "":
        return "(anonymous)"
    if name == "model" and value == "":
        return "(unknown)"
    return str(value)
