"""Finding the request that makes a step fail, so that it fails alone and the rest of the batch goes on.

When a step raises, its requests are re-run on the same scheduled input in halves (bisection): a half that raises
holds the suspect, a half that runs does not. After ceil(log2(batch)) probes one request is left; it is failed, and
the others run once more together, so a failed step costs at most log2(batch) + 1 re-runs. If that last run raises
as well (the fault was not one request's: a lost device, several bad requests), every request of the step fails.

Re-running is safe because nothing a step does is applied before it returns: its KV writes land at the same slots
with the same values on the retry (a request's input rows depend only on its frames and text position, which only
`Scheduler.update_from_output` moves), the repetition-penalty rows of a run that did not count are rebuilt from the
frames (`SeenTable` notices that the frames did not advance), and a probe's sampled frames are thrown away: only the
last run's output is applied, once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from services.engine.outputs import ModelRunnerOutput, ScheduledSequence

_log = logging.getLogger(__name__)

Execute = Callable[[list[ScheduledSequence]], ModelRunnerOutput]


@dataclass(frozen=True, slots=True)
class IsolatedStep:
    """The outcome of a failed step after isolation: what ran (and its output), and what failed (and why)."""

    survivors: list[ScheduledSequence]
    """The requests whose re-run succeeded; `output` holds their frames (empty when none survived)."""
    output: ModelRunnerOutput | None
    failed: list[ScheduledSequence]
    error: Exception
    """The error the failed requests are failed with (the one their own run raised)."""
    num_reruns: int


def isolate_failure(execute: Execute, scheduled: list[ScheduledSequence], error: Exception) -> IsolatedStep:
    """Re-run a failed step's `scheduled` requests in halves; `error` is what the whole step raised."""
    suspects, num_reruns = scheduled, 0
    while len(suspects) > 1:
        half = suspects[: len(suspects) // 2]
        num_reruns += 1
        try:
            execute(half)  # a probe: its frames are discarded, only the final run's count
        except Exception as probe_error:  # noqa: BLE001 - a raising half holds the suspect
            suspects, error = half, probe_error
        else:
            suspects = suspects[len(suspects) // 2 :]
    survivors = [item for item in scheduled if item not in suspects]
    if not survivors:
        return IsolatedStep([], None, suspects, error, num_reruns)
    num_reruns += 1
    try:
        output = execute(survivors)
    except Exception as rest_error:  # noqa: BLE001 - not one request's fault: the whole step fails
        _log.exception("decode step still failed without request %s; failing all %d requests",
                       suspects[0].seq.request_id, len(scheduled))
        return IsolatedStep([], None, scheduled, rest_error, num_reruns)
    return IsolatedStep(survivors, output, suspects, error, num_reruns)
