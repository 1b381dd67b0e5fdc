"""`voxmesh up --tls-dir DIR`: the certificates of a mesh on this machine, by fixed names.

DIR holds `ca.pem` (the CA that signed the others), `server.pem` and `server-key.pem` (presented by the embedded
nats-server and the gateway alike: its names must cover 127.0.0.1, or whatever clients dial) and, optionally,
`client.pem` and `client-key.pem`: with them the server verifies its clients and every service presents that
certificate. With `--nats-cluster N` the members' routes are mutual TLS with `server.pem` in both directions, so it
must allow client authentication as well (no extended key usage, or both).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.bus.cluster_config import RouteTls
from services.bus.server_config import ServerTls


class TlsDirError(ValueError):
    """The directory lacks a file it needs; the message names it."""


@dataclass(frozen=True, slots=True)
class TlsDir:
    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def cert_file(self) -> Path:
        return self.directory / "server.pem"

    @property
    def key_file(self) -> Path:
        return self.directory / "server-key.pem"

    @property
    def client_cert_file(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_key_file(self) -> Path:
        return self.directory / "client-key.pem"

    @property
    def verifies_clients(self) -> bool:
        return self.client_cert_file.is_file()

    @classmethod
    def open(cls, directory: Path) -> TlsDir:
        """The directory, checked: every file it must have is there."""
        tls = cls(directory.resolve())
        needed = [tls.ca_file, tls.cert_file, tls.key_file] + ([tls.client_key_file] if tls.verifies_clients else [])
        missing = [path.name for path in needed if not path.is_file()]
        if missing:
            raise TlsDirError(f"--tls-dir {directory}: {', '.join(missing)} missing (it needs ca.pem, server.pem, "
                              "server-key.pem, and client-key.pem beside a client.pem)")
        return tls

    def server(self) -> ServerTls:
        """The embedded nats-server's TLS."""
        return ServerTls(self.cert_file, self.key_file, self.ca_file if self.verifies_clients else None)

    def routes(self) -> RouteTls:
        """The routes of an embedded cluster: the server certificate both ways (it must allow client authentication
        too: no extended key usage, or both), verified against the CA."""
        return RouteTls(self.cert_file, self.key_file, self.ca_file)

    def environment(self, *, gateway: bool) -> dict[str, str]:
        """A child's TLS variables: every service verifies NATS against the CA (and presents the client
        certificate when there is one); the gateway serves HTTPS with the server certificate."""
        env = {"VOXMESH_NATS_TLS_CA_FILE": str(self.ca_file)}
        if self.verifies_clients:
            env.update(VOXMESH_NATS_TLS_CERT_FILE=str(self.client_cert_file),
                       VOXMESH_NATS_TLS_KEY_FILE=str(self.client_key_file))
        if gateway:
            env.update(VOXMESH_TLS_CERT_FILE=str(self.cert_file), VOXMESH_TLS_KEY_FILE=str(self.key_file))
        return env
