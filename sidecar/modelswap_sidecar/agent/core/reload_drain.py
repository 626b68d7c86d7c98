"""An unload from Triton drains the model first, as a swap-out does (issue 26: Triton's
python backend crashed when a model was unloaded with requests in flight to it).

Every path that unloads a serving model from Triton goes through `drain` first: a reload
(`Actuator.reload`), a model removed from the node (`Actuator.unload`: missing from the
desired set past the grace period, or the control API's `DELETE /v1/models/{uid}`), and
the swap-out of a model whose runtime cannot attach (`onSwapOut: drop` semantics:
`Actuator._swap_out` unloads it). The unloads of a dead runtime (`unload_dead`: nothing
left to answer) do not drain.

New requests meanwhile: a reload and a drop-style swap-out hold the model (`Actuator.held`):
the gateway takes it for not resident, so they wait in its swap-in queue
(`gateway.queueing`) and are served once the model is loaded again (the reload's load,
or the dropped model's next swap-in). A removal holds nothing: it takes the model out of
the desired set first, so they get what they get once it is gone (404 `ModelNotFound`:
the gateway no longer routes the name).

`drain` waits for the requests already past the queue (at Triton, or released to it) to
be answered, at most `timeout_seconds` (`policy.drainTimeoutSeconds`); past it, the
requests still at Triton are ended exactly as a swap-out's overdue drain ends them
(`GatewayApp.end_requests`: their connections to Triton close, Triton cancels them, their
clients get 503 `DrainDeadline` with Retry-After and a message naming the unload's
`Purpose`), and it waits `end_grace_seconds` more for them to leave. The gateway is a port
(`ports.drain_ends.GatewayRequests`); without one (no gateway) nothing is in flight.
(`ReloadDrain` keeps the name it had when reloads alone drained.)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from modelswap_sidecar.agent.core.records import AgentModel

log = logging.getLogger(__name__)


class HeldRequests(Protocol):
    """What an unload's drain reads and does at the gateway (on the agent's event loop)."""

    def queued(self, uid: str) -> int:
        """The model's requests waiting in its swap-in queue (held: they never reach the
        model being unloaded)."""
        ...

    def end(self, triton_name: str, why: str) -> int:
        """End the model's requests at Triton, each answered 503 `DrainDeadline` with
        `why`; the number ended."""
        ...


@dataclass(frozen=True)
class Purpose:
    """Why the model leaves Triton, as the log and the ended requests' 503 say it."""

    #: what unloads it, e.g. "reload"
    action: str
    #: "the model is {being} ...", e.g. "being reloaded"
    being: str
    #: what the ended request's client should do, e.g. "send it again (...)"
    then: str
    #: what new requests get meanwhile, as the log says it
    newcomers: str


RELOAD = Purpose(
    "reload",
    "being reloaded",
    "send it again (it is served once the model is loaded again)",
    "holds new requests",
)
REMOVAL = Purpose(
    "unload",
    "being removed from this node (deleted, or missing from the desired set past its grace)",
    "it is no longer served here",
    "answers new requests as gone (404)",
)
DROP = Purpose(
    "swap-out",
    "being swapped out (unloaded from Triton: its runtime cannot keep its memory)",
    "send it again (the model swaps back in)",
    "holds new requests",
)


@dataclass(frozen=True)
class ReloadDrain:
    """How every unload drains (the name is from when reloads alone drained)."""

    requests: HeldRequests
    #: `policy.drainTimeoutSeconds`: how long an unload waits for its model's requests
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
    purpose: Purpose,
) -> int:
    """Before `purpose`'s unload: wait until none of `model`'s requests is past its queue;
    past the timeout, end those at Triton and wait the grace period. `changed` returns at
    the next request answered (the gateway's directory signals it while the model drains,
    `Actuator.draining`) or within a second. The number of requests ended."""
    requests = drain_settings.requests
    waiting = outstanding(model, requests)
    if not waiting:
        return 0
    log.info(
        "model %s: %s %s and drains %d request(s) in flight before it unloads the model "
        "(policy.drainTimeoutSeconds %g)",
        model.uid,
        purpose.action,
        purpose.newcomers,
        waiting,
        drain_settings.timeout_seconds,
    )
    if await _until_drained(model, requests, drain_settings.timeout_seconds, clock, changed):
        return 0
    why = (
        f"the model is {purpose.being} and its drain waited "
        f"{drain_settings.timeout_seconds:g} s (policy.drainTimeoutSeconds) for this request, "
        f"which was ended so the {purpose.action} could go on; {purpose.then}"
    )
    ended = requests.end(model.triton_name, why)
    if not await _until_drained(model, requests, drain_settings.end_grace_seconds, clock, changed):
        log.warning(
            "model %s: %d request(s) still in flight %g s after the %s's drain ended them; "
            "unloading it anyway",
            model.uid,
            outstanding(model, requests),
            drain_settings.end_grace_seconds,
            purpose.action,
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
