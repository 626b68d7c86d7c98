"""A swap-out's drain that outlasts its timeout ends the model's requests, not the swap-out
(issue 26, item 3).

The engine's swap-out waits for the model's `in_use()` work (`engine.swaps`); a generation
whose client keeps reading, or a model that ignores cancellation until its next token,
could hold it past `policy.drainTimeoutSeconds`, after which the swap-out used to roll
back, retry, and leave other models waiting for its room. Here the engine's drain-overdue
listener (called on a timer thread) hands the model's Triton name to the gateway's event
loop, whose `end_requests` cancels every request the gateway has at Triton for it: their
connections to Triton close, Triton cancels them (`request.is_cancelled()`), their clients
get 503 `DrainDeadline` with Retry-After, and the drain completes within the engine's
`drain_end_grace_seconds`. The engine knows nothing of the gateway: this module wires
the two.

Every other unload from Triton (a reload, a removal, a drop-style swap-out) drains the
same way (`agent.core.reload_drain`): `GatewayRequests` tells the actuator how many of a
model's requests wait in the gateway's queue, and ends those at Triton with the same
`end_requests`.
"""

from __future__ import annotations

import asyncio
import logging

from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.reload_drain import ReloadDrain
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.gateway.app import GatewayApp

log = logging.getLogger(__name__)


def end_requests_on_overdue_drains(
    engine: Engine, app: GatewayApp, loop: asyncio.AbstractEventLoop, drain_timeout_seconds: float
) -> None:
    """Have `engine` tell `app` (on `loop`) to end a model's requests at Triton when its
    swap-out's drain passes `drain_timeout_seconds`."""
    why = (
        f"the model is being swapped out and its drain waited {drain_timeout_seconds:g} s "
        "(policy.drainTimeoutSeconds) for this request, which was ended so the swap-out "
        "could finish; send it again (the model swaps back in)"
    )

    def overdue(triton_name: str) -> None:
        try:
            loop.call_soon_threadsafe(app.end_requests, triton_name, why)
        except RuntimeError:  # the agent is stopping: its loop is closed
            log.info("no gateway to end %s's requests: the agent is stopping", triton_name)

    engine.on_drain_overdue(overdue)


class GatewayRequests:
    """`reload_drain.HeldRequests` over the agent's gateway (same event loop)."""

    def __init__(self, app: GatewayApp) -> None:
        self.app = app

    def queued(self, uid: str) -> int:
        return self.app.gateway.queues.depth(uid)

    def end(self, triton_name: str, why: str) -> int:
        return self.app.end_requests(triton_name, why)


def drain_reloads_through_gateway(
    actuator: Actuator, app: GatewayApp, drain_timeout_seconds: float, end_grace_seconds: float
) -> None:
    """Have each of `actuator`'s unloads from Triton drain its model's requests at `app`
    first."""
    actuator.drain_reloads_with(
        ReloadDrain(
            requests=GatewayRequests(app),
            timeout_seconds=drain_timeout_seconds,
            end_grace_seconds=end_grace_seconds,
        )
    )
