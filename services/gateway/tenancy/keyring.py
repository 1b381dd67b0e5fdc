"""Authentication of a call to its tenant: the keys file's named keys, the bare list's unnamed ones, or nobody.

Every presented key is hashed (SHA-256) and compared in constant time against every known digest, with no early
exit, so neither a key's length nor its position shows in the timing. A refusal never says whether the header was
missing, malformed or wrong.

The keys file is read again when its modification time changes, checked at most once per `reload_interval_s` on
the calls that authenticate (no watcher task to own): an edit takes effect within a second, on every gateway that
reads the file. An edit that does not parse keeps the keys in force and logs why.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from services.gateway.http.auth import Unauthorized
from services.gateway.tenancy.keys_file import KeyEntry, KeysFile, KeysFileError, read_keys_file, secret_digest
from services.gateway.tenancy.tenant import Limits, Tenant, anonymous

log = logging.getLogger(__name__)

RELOAD_INTERVAL_S = 1.0
UNNAMED_PREFIX = "=k"  # limit-key tokens of the bare list's keys: `=` never appears in a name from the file


def unnamed_tenant(secret: bytes, limits: Limits) -> Tenant:
    """A key of the bare list: no name, the default limits, limited on its own (under a token derived from its
    hash, the same on every gateway)."""
    token = hashlib.sha256(b"voxmesh-limit-key:" + secret).hexdigest()[:20]
    return Tenant(name="", limit_key=UNNAMED_PREFIX + token, key_class="unnamed", limits=limits)


class Keyring:
    """The keys a gateway accepts, and the tenant each one authenticates as."""

    def __init__(self, bare_keys: tuple[bytes, ...] = (), keys_file: Path | None = None, *,
                 reload_interval_s: float = RELOAD_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        """Raises KeysFileError when `keys_file` cannot be used at start."""
        self._bare_keys = bare_keys
        self._path = keys_file
        self._interval_s = reload_interval_s
        self._clock = clock
        self._checked_at = clock()
        self._mtime_ns = self._stat()
        self._entries: tuple[KeyEntry, ...] = ()
        self._anonymous = anonymous()
        self._apply(read_keys_file(keys_file) if keys_file is not None else KeysFile(Limits(), ()))

    @property
    def is_open(self) -> bool:
        """No key configured: every call is the anonymous tenant's."""
        self._maybe_reload()
        return not self._entries

    @property
    def digests(self) -> tuple[bytes, ...]:
        """The digests of every accepted key (the operator's routes compare against these when no admin keys)."""
        return tuple(entry.digest for entry in self._entries)

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant of `authorization` (`Bearer <key>`); the anonymous tenant when no key is configured.
        Raises Unauthorized."""
        self._maybe_reload()
        entries = self._entries
        if not entries:
            return self._anonymous
        scheme, _, token = (authorization or "").partition(" ")
        offered = secret_digest(token.strip().encode() if scheme.lower() == "bearer" else b"")
        found: Tenant | None = None
        for entry in entries:  # every digest compared: no early exit
            if hmac.compare_digest(offered, entry.digest):
                found = entry.tenant
        if found is None:
            raise Unauthorized()
        return found

    def _apply(self, parsed: KeysFile) -> None:
        unnamed = tuple(KeyEntry(secret_digest(key), unnamed_tenant(key, parsed.defaults)) for key in self._bare_keys)
        named = {entry.digest for entry in parsed.entries}
        self._entries = parsed.entries + tuple(entry for entry in unnamed if entry.digest not in named)
        self._anonymous = anonymous(parsed.defaults)

    def _stat(self) -> int | None:
        if self._path is None:
            return None
        try:
            return os.stat(self._path).st_mtime_ns
        except OSError:
            return None

    def _maybe_reload(self) -> None:
        if self._path is None:
            return
        now = self._clock()
        if now - self._checked_at < self._interval_s:
            return
        self._checked_at = now
        mtime = self._stat()
        if mtime == self._mtime_ns:
            return
        self._mtime_ns = mtime
        try:
            parsed = read_keys_file(self._path)
        except KeysFileError as exc:
            log.error("keys file not reloaded, the keys in force stay: %s", exc)
            return
        self._apply(parsed)
        log.info("keys file reloaded: %d named keys", len(parsed.entries))
