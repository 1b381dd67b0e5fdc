"""Typed service settings that come from flags and environment variables, documented once.

Each service declares a frozen dataclass whose fields carry `setting(...)` metadata: the
environment variable, the help text, and whether the value is a secret. From that one
declaration we derive the argparse flags, the environment lookup and the README table, so
the three never drift apart. Secrets (credentials) are read from the environment or a file,
never from a flag: flags show up in `ps` and in shell history.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from typing import Any, TypeVar

T = TypeVar("T")

_ENV_PREFIX = "VOXMESH_"


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the flag and variable."""


def setting(default: Any, help: str, *, env: str | None = None, secret: bool = False, choices: tuple | None = None):
    """Declare a settings field. `env` defaults to VOXMESH_<FIELD NAME IN CAPITALS>."""
    meta = {"help": help, "env": env, "secret": secret, "choices": choices}
    return dataclasses.field(default=default, metadata=meta)


def env_name(field: dataclasses.Field) -> str:
    return field.metadata.get("env") or _ENV_PREFIX + field.name.upper()


def flag_name(field: dataclasses.Field) -> str:
    return "--" + field.name.replace("_", "-")


def _field_type(cls: type, field: dataclasses.Field) -> type:
    hint = typing.get_type_hints(cls)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _convert(cls: type, field: dataclasses.Field, raw: str) -> Any:
    kind = _field_type(cls, field)
    try:
        if kind is bool:
            lowered = raw.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            value: Any = lowered in ("1", "true", "yes", "on")
        elif kind in (int, float):
            value = kind(raw)
        else:
            value = raw
    except ValueError:
        raise SettingsError(
            f"{flag_name(field)} / {env_name(field)}: expected {kind.__name__}, got {raw!r}"
        ) from None
    choices = field.metadata.get("choices")
    if choices and value not in choices:
        raise SettingsError(f"{flag_name(field)} / {env_name(field)}: {value!r} is not one of {', '.join(map(str, choices))}")
    return value


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one flag per non-secret field; defaults stay None so the environment can fill them."""
    for field in dataclasses.fields(cls):
        if field.metadata.get("secret"):
            continue
        help_text = f"{field.metadata['help']} (env {env_name(field)}; default {field.default!r})"
        parser.add_argument(flag_name(field), dest=field.name, default=None, help=help_text)


def resolve(cls: type[T], args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> T:
    """Build settings with precedence flag > environment > default, converting and validating each value."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        raw = getattr(args, field.name, None) if args is not None and not field.metadata.get("secret") else None
        if raw is None:
            raw = environ.get(env_name(field))
        if raw is None and field.metadata.get("secret"):
            path = environ.get(env_name(field) + "_FILE")
            raw = _read_secret_file(path, env_name(field)) if path else None
        if raw is not None:
            values[field.name] = _convert(cls, field, str(raw))
    return cls(**values)


def describe(settings: Any) -> str:
    """Every setting's value as `name=value`, secrets left out: the start-up log line of a service."""
    return " ".join(f"{field.name}={getattr(settings, field.name)!r}" for field in dataclasses.fields(settings)
                    if not field.metadata.get("secret"))


def _read_secret_file(path: str, variable: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError as error:
        raise SettingsError(f"{variable}_FILE={path}: cannot read the file ({error.strerror})") from None


def markdown_table(cls: type, skip: type | None = None) -> str:
    """The README's table of settings for one service, leaving out the fields of base class `skip`."""
    skipped = {f.name for f in dataclasses.fields(skip)} if skip is not None else set()
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for field in dataclasses.fields(cls):
        if field.name in skipped:
            continue
        flag = "(none: secret)" if field.metadata.get("secret") else f"`{flag_name(field)}`"
        env = f"`{env_name(field)}`" + (f" or `{env_name(field)}_FILE`" if field.metadata.get("secret") else "")
        default = "" if field.metadata.get("secret") else f"`{field.default!r}`"
        rows.append(f"| {flag} | {env} | {default} | {field.metadata['help']} |")
    return "\n".join(rows)
