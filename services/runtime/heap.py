"""The interpreter's heap after start-up: what a service holds for its whole life is frozen out of the collector.

A service's start-up leaves hundreds of thousands of objects that live as long as the process (torch's modules, the
model's parameters and buffers, the captured graphs' bookkeeping, the settings and the bus clients). Python's cyclic
collector walks every object it tracks in its oldest generation at each full collection, so with these in it a full
collection under load stalls the thread that triggers it, and every thread waiting for the interpreter lock, for
as long as the walk takes (the services' modules alone are a few hundred thousand objects; frozen, the walk is
nearly free). On decode's engine thread that is a step every stream waits for. `gc.freeze()` moves every object
tracked now into a generation the collector never walks; what is allocated later is collected as before.

Only the service processes do it (`services.runtime.process` turns it on): a test that runs services in its own
process keeps its collector as it was.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

_enabled = False


def enable_freezing() -> None:
    """From now on `freeze_long_lived` freezes (called by a service process's entry, before it builds anything)."""
    global _enabled
    _enabled = True


def freeze_long_lived() -> int:
    """Collect what start-up left as garbage, then freeze everything still alive; the number of objects frozen
    (0 where freezing is not enabled in this process)."""
    if not _enabled:
        return 0
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("froze %d objects allocated at start-up out of the cyclic collector", frozen)
    return frozen
