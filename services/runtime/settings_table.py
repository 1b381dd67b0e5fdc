"""The README's settings section, generated from the services' settings classes (a test keeps them equal)."""

from __future__ import annotations

import importlib

from services.runtime.common_settings import CommonSettings
from services.runtime.process import SERVICES
from services.runtime.provision_settings import ProvisionSettings
from services.runtime.settings_schema import markdown_table


def settings_markdown() -> str:
    parts = ["### every service\n", markdown_table(CommonSettings)]
    settings = {name: importlib.import_module(f"services.{name}.service").SETTINGS for name in SERVICES}
    for name, cls in settings.items():
        # A service whose settings extend another's (prefill runs decode's engine) lists only its own.
        parent = next((other for other, base in settings.items() if base is not cls and issubclass(cls, base)), None)
        if parent is None:
            parts += [f"\n### {name}\n", markdown_table(cls, skip=CommonSettings)]
        else:
            parts += [f"\n### {name}\n", f"Every {parent} setting above, and:\n",
                      markdown_table(cls, skip=settings[parent])]
    parts += ["\n### provision\n", "`voxmesh provision` (the one administrative step): every setting of \"every service\" "
              "above, and:\n", markdown_table(ProvisionSettings, skip=CommonSettings)]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(settings_markdown(), end="")
