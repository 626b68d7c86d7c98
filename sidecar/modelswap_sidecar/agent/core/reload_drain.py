"""A reload drains the model before it leaves Triton, as a swap-out does (issue 26: Triton's
python backend crashed when a model was unloaded with requests in flight to it).

While a reload holds its model (`Actuator.reload`), the gateway takes the model for not
resident, so new requests wait in its swap-in queue (`gateway.queueing`) and are served
once the model is loaded again. `drain` then waits for the requests already past the
queue (at Triton, or released to it) to be answered, at most `timeout_seconds`
(`policy.drainTimeoutSeconds`); past it, the requests still at Triton are ended exactly as
a swap-out's overdue drain ends them (`GatewayApp.end_requests`: their connections to
Triton close, Triton cancels them, their clients get 503 `DrainDeadline` with
Retry-After), and it waits `end_grace_seconds` more for them to leave. The gateway is a
port (`ports.drain_ends.GatewayRequests`); without one (no gateway) nothing is in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from modelswap_sidecar.agent.core.records import AgentModel

log = logging.getLogger(__name__)


class HeldRequests(Protocol):
    """What a reload's drain reads and does at the gateway (on the agent's event loop)."""

    def queued(self, uid: str) -> int:
        """The model's requests waiting in its swap-in queue (held: they never reach the
        model being reloaded)."""
        ...

    def end(self, triton_name: str, why: str) -> int:
        """End the model's requests at Triton, each answered 503 `DrainDeadline` with
        `why`; the number ended."""
        ...


@dataclass(frozen=True)
class ReloadDrain:
    requests: HeldRequests
    #: `policy.drainTimeoutSeconds`: how long a reload waits for its model's requests
    timeout_seconds: float
    #: after ending them, how long it waits for them to leave (the engine's
    #: `drain_end_grace_seconds`, as a swap-out's drain)
    end_grace_seconds: float


def outstanding(model: AgentModel, requests: HeldRequests) -> int:
    """The model's requests past its queue: at Triton, or released to it and on their way
    (`active_requests` counts every admitted or queued request until it is answered)."""
    return max(model.active_requests - requests.queued(model.uid), 0)


async def drain(
    model: AgentModel,
    drain_settings: ReloadDrain,
    *,
    clock: Callable[[], float],
    changed: Callable[[float], Awaitable[None]],
) -> int:
    """Wait until none of `model`'s requests is past its queue; past the timeout, end those
    at Triton and wait the grace period. `changed` returns at the next request answered
    (the gateway's directory signals it while the model is held) or within a second. The
    number of requests ended."""
    requests = drain_settings.requests
    waiting = outstanding(model, requests)
    if not waiting:
        return 0
    log.info(
        "model %s: reload holds new requests and drains %d in flight first "
        "(policy.drainTimeoutSeconds %g)",
        model.uid,
        waiting,
        drain_settings.timeout_seconds,
    )
    if await _until_drained(model, requests, drain_settings.timeout_seconds, clock, changed):
        return 0
    why = (
        f"the model is being reloaded and its drain waited {drain_settings.timeout_seconds:g} s "
        "(policy.drainTimeoutSeconds) for this request, which was ended so the reload could "
        "go on; send it again (it is served once the model is loaded again)"
    )
    ended = requests.end(model.triton_name, why)
    if not await _until_drained(model, requests, drain_settings.end_grace_seconds, clock, changed):
        log.warning(
            "model %s: %d request(s) still in flight %g s after the reload's drain ended them; "
            "unloading it anyway",
            model.uid,
            outstanding(model, requests),
            drain_settings.end_grace_seconds,
        )
    return ended


async def _until_drained(
    model: AgentModel,
    requests: HeldRequests,
    seconds: float,
    clock: Callable[[], float],
    changed: Callable[[float], Awaitable[None]],
) -> bool:
    deadline = clock() + seconds
    while outstanding(model, requests):
        left = deadline - clock()
        if left <= 0:
            return False
        await changed(left)
    return True
