"""The README's settings section, generated from the services' settings classes (a test keeps them equal)."""

from __future__ import annotations

import importlib

from services.runtime.common_settings import CommonSettings
from services.runtime.process import SERVICES
from services.runtime.settings_schema import markdown_table


def settings_markdown() -> str:
    parts = ["### every service\n", markdown_table(CommonSettings)]
    for name in SERVICES:
        module = importlib.import_module(f"services.{name}.service")
        parts += [f"\n### {name}\n", markdown_table(module.SETTINGS, skip=CommonSettings)]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(settings_markdown(), end="")
