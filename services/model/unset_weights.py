"""Modules built without their initial values: a loader fills every weight from the checkpoint right after.

`torch.nn.init`'s functions are skipped while `unset_weights()` is active (in this thread only: a torch function
mode), so building a module allocates its tensors and nothing more. Built on the meta device, the skipped draws are
what matters: a random draw on a meta tensor runs torch's Python reference of it, whose first use imports
`torch._dynamo` (about a second of a service's start on two cores) for values nobody reads.
"""

from __future__ import annotations

from typing import Any

from torch.overrides import TorchFunctionMode


class unset_weights(TorchFunctionMode):  # noqa: N801 - used as a context manager, named as one
    """`with unset_weights():` any `torch.nn.init` call returns its tensor untouched; every other call runs as usual."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else (kwargs or {}).get("tensor")
        return func(*args, **(kwargs or {}))
