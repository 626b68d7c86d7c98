"""Placing, loading and unloading: where a waiting model loads (`placement.place` decides;
its victims are swapped out first), its load, and its unload and removal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from modelswap_sidecar.agent.core import lifecycle
from modelswap_sidecar.agent.core.holds import Holds
from modelswap_sidecar.agent.core.isolation import each_record
from modelswap_sidecar.agent.core.placement import Deferral, Placement, place
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.core.reload_drain import REMOVAL
from modelswap_sidecar.agent.core.swapping import Swapping
from modelswap_sidecar.agent.core.views import model_view
from modelswap_sidecar.agent.core.workplace import Workplace, labels_of
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.decisions import SwapOut
from modelswap_sidecar.policy.inputs import NodeView, Residency
from modelswap_sidecar.policy.load_order import load_order

log = logging.getLogger(__name__)


class Placing:
    def __init__(
        self, w: Workplace, holds: Holds, swapping: Swapping, *, retry_failed_seconds: float
    ) -> None:
        self.w = w
        self.holds = holds
        self.swapping = swapping
        #: How long a failed load waits before the next try (same generation).
        self.retry_failed_seconds = retry_failed_seconds
        #: The node view one `reconcile` pass places against: made at its first placement
        #: and again after each load it starts (a deferral changes nothing in it), so a pass
        #: over n waiting models builds one view, not n (each is O(n): 500 deferred models
        #: took seconds of the event loop per pass).
        self._placing: NodeView | None = None

    def candidate_gpus(self, model: AgentModel) -> list[str]:
        """The operator's GPU, else the GPU the engine keeps host copies for, else all."""
        if model.entry.gpu is not None:
            return [model.entry.gpu]
        if model.gpu is not None:
            return [self.w.gpu_uuids[model.gpu]]
        try:
            return [self.w.gpu_uuids[self.w.engine.gpu_of(model.triton_name)]]
        except UnknownModel:
            return list(self.w.gpu_uuids)

    def try_place(
        self, model: AgentModel, *, fenced: bool = False, view: NodeView | None = None
    ) -> Placement | Deferral:
        """Where `model` can load now, or why not. `fenced`: the control service's fencing
        holds (nothing new is loaded); `view`: the node as it is now, when the caller has it."""
        now = self.w.clock()
        if fenced:
            return Deferral(
                reason="Fenced",
                message="Lease renewals and operator pushes have both failed for the grace "
                "period; nothing new is loaded",
            )
        candidate = model_view(model, Residency.SWAPPED_OUT, self.candidate_gpus(model)[0], now)
        node = view if view is not None else self.w.view()
        return place(node, candidate, self.candidate_gpus(model), now, self.w.policy.settings)

    def start_load(self, model: AgentModel, placement: Placement) -> None:
        lifecycle.place(model, self.w.ordinal_of(placement.gpu), placement.message)
        self.w.spawn(self._load(model, placement.victims), f"load-{model.uid}")

    async def _load(self, model: AgentModel, victims: tuple[SwapOut, ...]) -> None:
        async with self.w.lock_of(model.uid):
            _, refused = await self.swapping.make_room(
                victims, engine_swap_in=False, stop_at_refusal=True
            )
            if refused is not None:
                # The room this load counted on is still taken: loading now would
                # over-commit the GPU and fail (LoadFailed until the retry). The model
                # waits for the next placement, which weighs the victims again.
                victim, result = refused
                lifecycle.defer(
                    model,
                    "WaitingForRoom",
                    f"{victim.uid} did not give up its room ({result.reason}"
                    f"{': ' + result.message if result.message else ''}); placed again next",
                )
                log.info("model %s waits: %s", model.uid, model.message)
                self.w.notify()
                return
            await self.w.load_locked(model)

    def reconcile(self, *, fenced: bool = False, order: Sequence[AgentModel] = ()) -> None:
        """Place every desired model that waits for a place (pending, deferred, failed and
        due for a retry), those in `order` first and in that order, then the others in the
        policy's `load_order` (pinned first, then by priority: a model deferred after a
        Triton restart is placed before less important ones on later ticks too); while
        `fenced`, each is deferred instead."""
        now = self.w.clock()
        self._placing = None  # this pass's view, made at its first placement
        first = {m.uid for m in order}
        rest = load_order(
            (m for m in self.w.records.values() if m.uid not in first), lambda m: m.policy
        )
        models = [*order, *rest]
        each_record(models, "place", lambda model: self._reconcile(model, now, fenced))

    def _reconcile(self, model: AgentModel, now: float, fenced: bool) -> None:
        if not model.desired or self.w.busy(model.uid):
            return
        if model.serving is Serving.FAILED:
            due = (model.failed_at_seconds or 0.0) + self.retry_failed_seconds
            if now < due and model.failed_generation == model.entry.generation:
                return
        elif model.serving not in (Serving.PENDING, Serving.DEFERRED):
            return
        if self._placing is None:
            self._placing = self.w.view()
        decision = self.try_place(model, fenced=fenced, view=self._placing)
        if isinstance(decision, Placement):
            self._placing = None  # the load claims HBM: the next placement sees it
            self.start_load(model, decision)
        else:
            lifecycle.defer(model, decision.reason, decision.message)

    async def unload(self, model: AgentModel) -> None:
        """Missing from the set past the grace period (or forgotten, `forget`): out of
        Triton, host bytes kept. A loaded model drains first (`reload_drain`, `REMOVAL`).
        Not desired from the start: new requests are answered as once it is gone (404, the
        gateway routes it no more) rather than held for a model that will not return."""
        async with self.w.lock_of(model.uid):
            model.desired = False
            if model.serving is Serving.LOADED:
                await self.holds.drain(model, REMOVAL)
            if model.serving in (Serving.LOADED, Serving.LOADING, Serving.DROPPED):
                lifecycle.unloading(model)
                started = self.w.clock()
                await self.w.loader.unload(model)
                if self.w.metrics is not None:
                    self.w.metrics.observe_unload(labels_of(model), self.w.clock() - started)
            elif model.resolved is not None:
                self.w.loader.resolver.release(model.resolved)
                model.resolved = None
            lifecycle.unloaded(model)
        self.w.notify()

    async def forget(self, model: AgentModel) -> None:
        """Unload and delete everything held for the model, host-store bytes included."""
        await self.unload(model)
        async with self.w.lock_of(model.uid):
            remove = getattr(self.w.engine, "remove_model", None)
            if remove is not None:
                with contextlib.suppress(UnknownModel):
                    await asyncio.to_thread(remove, model.triton_name)
            else:
                log.warning(
                    "model %s: this engine cannot remove models; its host copy stays until "
                    "host-store pressure evicts it",
                    model.uid,
                )
            self.w.records.pop(model.uid, None)
            if self.w.metrics is not None:
                self.w.metrics.forget_model(labels_of(model))

    def start_dev_clocks(self) -> None:
        """A dev model's idle clock starts once its process has committed (the engine holds
        it RESIDENT), not when it was registered: until then it has no start (the policy
        counts it idle for 0 s, and never tries to swap out a model with nothing to save)."""
        for model in self.w.records.values():
            if not model.dev or model.serving is not Serving.LOADED:
                continue
            state = self.w.engine_state(model)
            if state in (None, EngineState.LOADING):
                model.resident_since_seconds = None
            elif state is EngineState.RESIDENT and model.resident_since_seconds is None:
                model.resident_since_seconds = self.w.clock()
