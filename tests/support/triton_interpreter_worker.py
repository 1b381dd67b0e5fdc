"""The process that runs `tests.support.triton_interpreter.interpreted` calls with Triton's interpreter on (its parent sets
TRITON_INTERPRET=1): reads one JSON-encoded call a line, answers one JSON line, {"value": repr} or {"error": trace}."""

from __future__ import annotations

import importlib
import json
import sys
import traceback


def answer(call: str) -> dict[str, str]:
    module = call.split("(", 1)[0].rsplit(".", 1)[0]
    try:
        importlib.import_module(module)
        top = module.split(".", 1)[0]
        return {"value": repr(eval(call, {top: importlib.import_module(top)}))}  # noqa: S307 - the tests' own calls
    except BaseException:  # noqa: BLE001 - the parent's assertion shows it
        return {"error": traceback.format_exc()[-6000:]}


def main() -> None:
    replies = sys.stdout
    sys.stdout = sys.stderr  # what the calls print must not mix with the replies
    for line in sys.stdin:
        replies.write(json.dumps(answer(json.loads(line))) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
