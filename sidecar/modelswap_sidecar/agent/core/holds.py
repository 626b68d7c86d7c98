"""What holds a model's requests while it is unloaded from Triton, and the drain before
that unload (`reload_drain`): a reload under way (which later ones join), a drop-style
swap-out, a removal.

While a reload or a drop-style swap-out holds a model, its new requests wait (the gateway
queues them, `held`); those in flight are drained first (`drain`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from modelswap_api.control import ActionResult
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.core.reload_drain import Purpose, ReloadDrain, drain
from modelswap_sidecar.agent.core.workplace import Workplace

log = logging.getLogger(__name__)


@dataclass
class Reload:
    """A reload under way (`Recovering.reload`): those asked meanwhile join it."""

    keep_host_copy: bool
    done: asyncio.Future[ActionResult]
    #: it holds the model's new requests (the gateway queues them) and drains the rest
    holding: bool = False
    #: it has drained and unloads the model: a client's own swap-in is refused
    unloading: bool = False
    #: it has decided about the host copy: a join asking to drop it comes too late
    decided: bool = False

    def takes(self, keep_host_copy: bool) -> bool:
        """A reload asked with `keep_host_copy` can join this one."""
        return keep_host_copy or not self.keep_host_copy or not self.decided


class Holds:
    def __init__(self, w: Workplace) -> None:
        self.w = w
        #: by UID: the reload under way, which later ones join
        self.reloads: dict[str, Reload] = {}
        #: how an unload from Triton (a reload, a removal, a drop-style swap-out) drains
        #: the model's requests first (the gateway's, `drain_reloads_with`); None: no
        #: gateway, nothing in flight to drain
        self.reload_drain: ReloadDrain | None = None
        #: UIDs whose requests a drain waits for now (`drain`)
        self.draining_uids: set[str] = set()
        #: UIDs a drop-style swap-out holds (new requests queue) while it drains and unloads
        self.held_swap_outs: set[str] = set()

    def drain_reloads_with(self, reload_drain: ReloadDrain) -> None:
        """Have each unload from Triton (a reload, a removal, a drop-style swap-out) drain
        its model's requests through `reload_drain` first."""
        self.reload_drain = reload_drain

    def held(self, uid: str) -> bool:
        """A reload or a drop-style swap-out holds the model: its new requests wait (the
        gateway queues them)."""
        under_way = self.reloads.get(uid)
        return (under_way is not None and under_way.holding) or uid in self.held_swap_outs

    def hold_state(self, uid: str) -> str | None:
        """What holds the model, as progress lines say it: Reloading, SwappingOut."""
        under_way = self.reloads.get(uid)
        if under_way is not None and under_way.holding:
            return "Reloading"
        return "SwappingOut" if uid in self.held_swap_outs else None

    def draining(self, uid: str) -> bool:
        """A drain waits for the model's requests (or holds it): each answer should
        `notify`."""
        return uid in self.draining_uids or self.held(uid)

    async def drain(self, model: AgentModel, purpose: Purpose) -> None:
        """Wait for (or end at the deadline) the model's requests in flight before an
        unload from Triton (`reload_drain.drain`)."""
        if self.reload_drain is None:
            return
        self.draining_uids.add(model.uid)
        try:
            await drain(
                model,
                self.reload_drain,
                clock=self.w.clock,
                changed=self.w.changed,
                purpose=purpose,
            )
        finally:
            self.draining_uids.discard(model.uid)

    def reload_refusal(self, model: AgentModel) -> ActionResult | None:
        """A client's own swap-in's refusal while a reload unloads the model."""
        under_way = self.reloads.get(model.uid)
        if under_way is None or not under_way.unloading:
            return None
        return ActionResult(
            uid=model.uid,
            outcome="refused",
            reason="Reloading",
            message="the model is being unloaded for a reload",
        )
