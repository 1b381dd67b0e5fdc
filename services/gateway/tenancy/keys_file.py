"""The keys file: named API keys, each kept only as the SHA-256 of its secret, with its limits and priority.

TOML (the standard library's parser):

    [defaults]                 # every key's limits unless its entry says otherwise; also the unnamed keys' of
    requests_per_s = 5         # VOXMESH_API_KEYS, and the anonymous tenant's when the file names no key
    burst = 10
    live_requests = 4
    audio_s_per_day = 3600

    [keys.reader-app]          # the name: 1..64 of A-Z a-z 0-9 _ - (requests carry it as their tenant)
    sha256 = "9f86d0..."       # hex SHA-256 of the secret (`voxmesh keys hash` prints an entry from stdin)
    class = "pro"              # the metrics' group (never the key); default "default"
    requests_per_s = 20        # a limit left out is the default's; -1: none for this key
    priority = "batch"         # the priority of its requests that ask for none (default "interactive")
    max_priority = "batch"     # the highest it may ask for (default: its priority)

A limit set to -1 means "none" for that key (over a default). The file can be read by anyone who operates the
gateway: a hash does not let its reader call the API.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from services.gateway.tenancy.tenant import DEFAULT_CLASS, PRIORITIES, Limits, Tenant

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
HEX_SHA256 = re.compile(r"^[0-9a-f]{64}$")
NO_LIMIT = -1
_LIMIT_FIELDS = tuple(f.name for f in fields(Limits))
_ENTRY_FIELDS = frozenset({"sha256", "class", "priority", "max_priority", *_LIMIT_FIELDS})


class KeysFileError(ValueError):
    """The keys file cannot be used (unreadable, not TOML, or an entry out of shape); the message says where."""


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One key: the digest its secret must hash to, and the tenant it authenticates as."""

    digest: bytes
    tenant: Tenant


@dataclass(frozen=True, slots=True)
class KeysFile:
    """A parsed keys file."""

    defaults: Limits
    entries: tuple[KeyEntry, ...]


def secret_digest(secret: bytes) -> bytes:
    """SHA-256 of a key's secret: what the file stores (hex) and what a presented key is compared by."""
    return hashlib.sha256(secret).digest()


def read_keys_file(path: Path) -> KeysFile:
    """Parse the keys file at `path`. Raises KeysFileError."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise KeysFileError(f"keys file {path}: {exc}") from exc
    return parse_keys_document(document, str(path))


def parse_keys_document(document: dict[str, Any], where: str = "keys file") -> KeysFile:
    """The keys file from its parsed TOML. Raises KeysFileError."""
    unknown = set(document) - {"defaults", "keys"}
    if unknown:
        raise KeysFileError(f"{where}: unknown tables {sorted(unknown)} (there are [defaults] and [keys.NAME])")
    defaults = _limits(_table(document.get("defaults", {}), f"{where} [defaults]"), Limits(), f"{where} [defaults]")
    keys = _table(document.get("keys", {}), f"{where} [keys]")
    entries, seen = [], set()
    for name, raw in keys.items():
        entry = _entry(name, _table(raw, f"{where} [keys.{name}]"), defaults, f"{where} [keys.{name}]")
        if entry.digest in seen:
            raise KeysFileError(f"{where} [keys.{name}]: the same secret as another key (each key needs its own)")
        seen.add(entry.digest)
        entries.append(entry)
    return KeysFile(defaults, tuple(entries))


def _entry(name: str, raw: dict[str, Any], defaults: Limits, where: str) -> KeyEntry:
    if not NAME.match(name):
        raise KeysFileError(f"{where}: a key's name is 1..64 of A-Z a-z 0-9 _ -")
    unknown = set(raw) - _ENTRY_FIELDS
    if unknown:
        raise KeysFileError(f"{where}: unknown fields {sorted(unknown)} (fields: {sorted(_ENTRY_FIELDS)})")
    digest = raw.get("sha256")
    if not isinstance(digest, str) or not HEX_SHA256.match(digest):
        raise KeysFileError(f"{where}: sha256 must be the 64 lowercase hex digits of the secret's SHA-256 "
                            "(`voxmesh keys hash` prints it)")
    key_class = raw.get("class", DEFAULT_CLASS)
    if not isinstance(key_class, str) or not NAME.match(key_class):
        raise KeysFileError(f"{where}: class is 1..64 of A-Z a-z 0-9 _ -")
    priority = _priority(raw.get("priority", "interactive"), f"{where}: priority")
    max_priority = _priority(raw.get("max_priority", priority), f"{where}: max_priority")
    if PRIORITIES.index(priority) > PRIORITIES.index(max_priority):
        raise KeysFileError(f"{where}: priority {priority!r} is above max_priority {max_priority!r}")
    tenant = Tenant(name=name, limit_key=name, key_class=key_class, limits=_limits(raw, defaults, where),
                    priority=priority, max_priority=max_priority)
    return KeyEntry(bytes.fromhex(digest), tenant)


def _limits(raw: dict[str, Any], base: Limits, where: str) -> Limits:
    """`base` with the limits `raw` sets (-1: none)."""
    changes: dict[str, Any] = {}
    for name in _LIMIT_FIELDS:
        if name not in raw:
            continue
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise KeysFileError(f"{where}: {name} must be a number (-1: no limit)")
        if value == NO_LIMIT:
            changes[name] = None
        elif value <= 0 or (name == "live_requests" and value != int(value)):
            raise KeysFileError(f"{where}: {name} must be > 0{' and whole' if name == 'live_requests' else ''}, "
                                f"or -1 for no limit; got {value}")
        else:
            changes[name] = int(value) if name == "live_requests" else float(value)
    if "requests_per_s" not in raw and "burst" in raw and base.requests_per_s is None:
        raise KeysFileError(f"{where}: burst without requests_per_s")
    return replace(base, **changes)


def _priority(value: Any, where: str) -> Any:
    if value not in PRIORITIES:
        raise KeysFileError(f"{where} must be one of {list(PRIORITIES)}, got {value!r}")
    return value


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise KeysFileError(f"{where}: must be a table")
    return value


def entry_text(name: str, secret: bytes, key_class: str = DEFAULT_CLASS) -> str:
    """A keys-file entry for `secret` (what `voxmesh keys hash` prints); limits are left to [defaults]."""
    if not NAME.match(name) or not NAME.match(key_class):
        raise KeysFileError("a key's name and class are 1..64 of A-Z a-z 0-9 _ -")
    return f'[keys.{name}]\nsha256 = "{secret_digest(secret).hex()}"\nclass = "{key_class}"\n'
