"""Compose's variable interpolation, so `voxmesh up` reads a compose file the way `docker compose` does.

The compose files choose images, ports and URLs by `${VAR:-default}`; a reader that took the text literally would
run `${VOXMESH_NATS_PORT:-4222}` as a port. The syntax is the Compose specification's: `$VAR` and `${VAR}`,
`${VAR:-default}` / `${VAR-default}` (default when unset or empty / when unset), `${VAR:?message}` /
`${VAR?message}` (an error), `${VAR:+other}` / `${VAR+other}` (other when set), and `$$` for a literal `$`.
Defaults may themselves hold variables. Interpolation applies to every string value of the document, not to keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_BRACED_HEAD = re.compile(rf"({_NAME})(?:(:?[-?+])|(?=\}}))")
_PLAIN = re.compile(_NAME)


class InterpolationError(ValueError):
    """A `${VAR:?message}` whose variable is missing, or a `${` that never closes; the message says which."""


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """`value` (a parsed YAML document or any part of it) with every string interpolated from `env`."""
    if isinstance(value, str):
        return interpolate_text(value, env)
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    return value


def interpolate_text(text: str, env: Mapping[str, str]) -> str:
    out: list[str] = []
    index = 0
    while (dollar := text.find("$", index)) != -1:
        out.append(text[index:dollar])
        following = text[dollar + 1:dollar + 2]
        if following == "$":
            out.append("$")
            index = dollar + 2
        elif following == "{":
            replacement, index = _braced(text, dollar + 2, env)
            out.append(replacement)
        elif plain := _PLAIN.match(text, dollar + 1):
            out.append(env.get(plain.group(0), ""))
            index = plain.end()
        else:  # a lone `$` (compose keeps it as it is)
            out.append("$")
            index = dollar + 1
    out.append(text[index:])
    return "".join(out)


def _braced(text: str, start: int, env: Mapping[str, str]) -> tuple[str, int]:
    """The value of the `${...}` whose body starts at `start`, and the index just past its `}`."""
    head = _BRACED_HEAD.match(text, start)
    if head is None:
        raise InterpolationError(f"invalid interpolation in {text!r}: `${{` must be followed by a variable name")
    name, operator = head.group(1), head.group(2)
    end = _closing_brace(text, head.end())
    if operator is None:
        return env.get(name, ""), end + 1
    argument = interpolate_text(text[head.end():end], env)
    value = env.get(name)
    is_set = value is not None and (value != "" or not operator.startswith(":"))
    kind = operator[-1]
    if kind == "-":
        return (value if is_set else argument) or "", end + 1
    if kind == "+":
        return (argument if is_set else ""), end + 1
    if not is_set:  # `?`
        raise InterpolationError(f"required variable {name} is missing a value: {argument or name}")
    return value or "", end + 1


def _closing_brace(text: str, start: int) -> int:
    """The index of the `}` that closes a `${` whose body starts at `start` (nested `${...}` skipped)."""
    depth = 1
    index = start
    while index < len(text):
        if text.startswith("${", index):
            depth += 1
            index += 2
            continue
        if text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    raise InterpolationError(f"invalid interpolation in {text!r}: a `${{` is never closed")
