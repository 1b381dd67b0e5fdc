"""Logging that carries the request id: set it once per unit of work, every log line inside shows it."""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("voxmesh_request_id", default=None)

FORMAT = "%(asctime)s %(levelname)s %(service)s [%(request_id)s] %(name)s: %(message)s"


@contextlib.contextmanager
def request_context(request_id: str | None) -> Iterator[None]:
    """Within the block (and tasks created in it), log lines carry `request_id`."""
    token = request_id_var.set(request_id)
    try:
        yield
    finally:
        request_id_var.reset(token)


class ContextFilter(logging.Filter):
    """Adds `service` and `request_id` ('-' when none) to every record."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get() or "-"
        record.service = self.service
        return True


def configure_logging(service: str, level: str | int = "INFO") -> None:
    """Root logging for a service process: one stderr handler whose lines name the service and request id."""
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter(service))
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
