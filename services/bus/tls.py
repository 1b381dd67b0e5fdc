"""TLS for a client of the bus: the CA that signed the NATS server's certificate, and optionally this client's own
certificate (for a server that verifies its clients)."""

from __future__ import annotations

import ssl
from pathlib import Path


class TlsConfigError(ValueError):
    """TLS settings that cannot be used together, or files that cannot be read; the message names them."""


def client_context(ca_file: str | Path | None, cert_file: str | Path | None = None,
                   key_file: str | Path | None = None) -> ssl.SSLContext | None:
    """A context that verifies the server against `ca_file` (its name or address must be in the certificate), and
    presents `cert_file` and `key_file` when given; None when no CA is given (a plain connection)."""
    if (cert_file is None) != (key_file is None):
        raise TlsConfigError("a client certificate needs both its certificate and its key file "
                             "(VOXMESH_NATS_TLS_CERT_FILE and VOXMESH_NATS_TLS_KEY_FILE)")
    if ca_file is None:
        if cert_file is not None:
            raise TlsConfigError("a client certificate needs the CA of the server too (VOXMESH_NATS_TLS_CA_FILE)")
        return None
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_file))
        if cert_file is not None:
            context.load_cert_chain(str(cert_file), str(key_file))
    except (OSError, ssl.SSLError) as error:
        raise TlsConfigError(f"cannot load the NATS TLS files ({ca_file}, {cert_file}, {key_file}): {error}") from None
    return context
