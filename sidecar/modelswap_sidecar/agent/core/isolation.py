"""One record's fault stays that record's.

The agent walks its records in many places: the policy loop (requests seen, engine states,
the HBM view, placing what waits), `GET /v1/models`, the SwapNode report, the metrics and
the gateway's routes. An unexpected exception while handling one model must not take the
others with it (issue 12: one record whose UID was not a UUID made every request and every
policy tick fail). So each walk handles its records one at a time through `each_record`:
an exception is caught for that record alone, logged once with its traceback (later
repeats at debug, so a fault that recurs every tick does not flood the log), and kept on
the record under what was being done; the model is then reported `Failed` with reason
`AgentError` until the same work succeeds on it again.

Messages name the kind of exception, never its text: the text of an arbitrary exception
may carry what must not reach a status or a response (a header, a path).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

from modelswap_sidecar.agent.core.records import AgentModel

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The reason a model with a fault is reported under.
FAULT_REASON = "AgentError"


def note_fault(model: AgentModel, what: str, error: BaseException) -> None:
    """Keep `error` on `model` under `what`; log it with its traceback the first time."""
    first = what not in model.faults
    model.faults[what] = (
        f"the agent failed to {what} this model ({type(error).__name__}); see the agent's log"
    )
    if first:
        log.error(
            "model %s: failed to %s it (%s); the model is reported Failed, the others go on",
            model.uid,
            what,
            type(error).__name__,
            exc_info=error,
        )
    else:
        log.debug("model %s: failed to %s it again (%s)", model.uid, what, type(error).__name__)


def guarded(
    model: AgentModel, what: str, work: Callable[[AgentModel], T], fallback: Callable[[], T]
) -> T:
    """`work(model)`, or `fallback()` when it raises (the fault noted on `model`)."""
    try:
        result = work(model)
    except Exception as e:
        note_fault(model, what, e)
        return fallback()
    model.faults.pop(what, None)
    return result


def each_record(
    models: Iterable[AgentModel], what: str, work: Callable[[AgentModel], T]
) -> list[T]:
    """`work` applied to every model in turn; a model whose work raises is left out of the
    result (its fault noted) and the rest go on."""
    results: list[T] = []
    for model in list(models):
        try:
            results.append(work(model))
        except Exception as e:
            note_fault(model, what, e)
        else:
            model.faults.pop(what, None)
    return results


def fault_message(model: AgentModel) -> str:
    return "; ".join(model.faults[what] for what in sorted(model.faults))
