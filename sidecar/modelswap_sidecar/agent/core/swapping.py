"""Swapping: the one decider of every swap-in (the policy's admission), swap-outs, and the
record of every swap.

Swaps are counted where they happen: the engine emits a `SwapEvent` for every swap it
completes (whoever asked: the policy loop, a manual call, the gateway, a client's own
swap-in, a victim swapped out to make room), with its real duration, and `_on_swap`
records it (the record's counters, `minResident`'s clock, the metrics); swaps the engine
does not do (a drop's unload, a reload) are recorded here.

A client's own swap-in (its `in_use()` on a swapped-out model) comes from the engine's
thread to `decide_client_swap_in`, the decider the engine is built with: it goes through
the same admission as any other, once a model still being adopted is taken back; a name no
record holds is refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from modelswap_api.control import ActionResult
from modelswap_sidecar.agent.core import lifecycle
from modelswap_sidecar.agent.core.holds import Holds
from modelswap_sidecar.agent.core.isolation import each_record
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.core.reload_drain import DROP
from modelswap_sidecar.agent.core.workplace import Workplace, labels_of
from modelswap_sidecar.engine.errors import EngineError, NoCapacity, UnknownModel
from modelswap_sidecar.engine.events import SwapEvent, SwapKind
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.decisions import AdmissionOutcome, SwapOut

log = logging.getLogger(__name__)

#: How long a swap-in waits for swap-outs or loads under way before refusing (a client's
#: own swap-in: for the model's adoption and load too).
ADMISSION_WAIT_SECONDS = 30.0
#: Reason of a client's swap-in refused because no record holds its model.
UNKNOWN_TO_AGENT = "UnknownModel"
#: Reason of a dropped model dropped again because no request loaded its weights in time.
RELOAD_TIMED_OUT = "ReloadTimedOut"


class Swapping:
    def __init__(self, w: Workplace, holds: Holds, *, adopting: bool) -> None:
        self.w = w
        self.holds = holds
        #: adoption has not ended: a client's swap-in of a name no record holds waits
        self.adopting = adopting
        self._admitting: dict[int, asyncio.Lock] = {}  # per GPU ordinal: see `swap_in`

    def adoption_ended(self) -> None:
        """The models a previous agent held are taken back (`adoption.adopt`, each held or
        left out): a client's swap-in of a name held by no record is refused from now on."""
        self.adopting = False
        self.w.notify()

    def decide_client_swap_in(self, name: str) -> None:
        """The engine's decider (`engine.core.SwapInDecider`), on the engine's thread
        serving a client's own swap-in request (its `in_use()` found the model swapped
        out): decided as any other swap-in (`swap_in`, the policy's admission), on the
        loop. A model still being adopted is waited for (bounded), then admitted; a name
        this agent does not hold is refused. A refusal is an EngineError the client
        receives."""
        loop = self.w.loop
        if loop is None or loop.is_closed():
            raise NoCapacity(
                f"swap-in of model {name!r} refused: the agent is not deciding swap-ins "
                "(not started yet, or stopping)"
            )
        result = asyncio.run_coroutine_threadsafe(self._client_swap_in(name), loop).result()
        if result.outcome != "refused":
            return
        if result.reason == UNKNOWN_TO_AGENT:
            raise UnknownModel(result.message)
        raise NoCapacity(f"swap-in of {result.uid} refused: {result.reason}: {result.message}")

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Record the engine's swaps on `loop`, and decide its clients' own swap-ins there
        (`decide_client_swap_in`; call once, from it)."""
        self.w.loop = loop
        self.w.engine.subscribe(self._from_engine)

    async def _client_swap_in(self, name: str) -> ActionResult:
        deadline = self.w.clock() + ADMISSION_WAIT_SECONDS
        model = await self._record_named(name, deadline)
        if model is None:
            return ActionResult(
                uid=name,
                outcome="refused",
                reason=UNKNOWN_TO_AGENT,
                message=f"swap-in of model {name!r} refused: this agent holds no such model"
                + (" (its adoption did not end in time)" if self.adopting else ""),
            )
        return await self._settled_swap_in(model, deadline)

    async def _record_named(self, name: str, deadline: float) -> AgentModel | None:
        """The record of engine model `name`; while adoption runs (a previous agent's model
        not taken back yet) waited for until `deadline`."""
        while True:
            model = next((m for m in self.w.records.values() if m.triton_name == name), None)
            if model is not None or not self.adopting or self.w.clock() >= deadline:
                return model
            await self.w.changed(deadline - self.w.clock())

    async def _settled_swap_in(self, model: AgentModel, deadline: float) -> ActionResult:
        """`swap_in`, once a load under way (an adoption) has finished. A client's own
        swap-in holds a request at Triton (its `in_use()`), so it never waits on the
        model's lock behind a reload, whose unload would wait for that request in turn:
        while a reload is asked or drains it waits here, and goes on at once if the model
        is resident by then (another swap-in brought it back); once the reload unloads the
        model it is refused (the reload's drain has ended the request at the gateway)."""
        while self.w.clock() < deadline:
            if self.w.engine_state(model) is EngineState.RESIDENT:
                return ActionResult(uid=model.uid, outcome="unchanged", reason="AlreadyResident")
            if (refused := self.holds.reload_refusal(model)) is not None:
                return refused
            if model.uid in self.holds.draining_uids and not model.desired:
                # a removal drains it: swapping it in for a request it then ends is waste
                return ActionResult(
                    uid=model.uid,
                    outcome="refused",
                    reason="Removed",
                    message="the model is being removed from this node",
                )
            if model.uid not in self.holds.reloads and model.serving is not Serving.LOADING:
                break
            await self.w.changed(deadline - self.w.clock())
        return await self.swap_in(model, refused_by_reload=True)

    def _from_engine(self, event: SwapEvent) -> None:
        """On the engine's thread: hand the event to the loop (before the engine call that
        made it returns, so its caller resumes with the swap recorded)."""
        if self.w.loop is not None and not self.w.loop.is_closed():
            self.w.loop.call_soon_threadsafe(self._on_swap, event)

    def _on_swap(self, event: SwapEvent) -> None:
        model = next((m for m in self.w.records.values() if m.triton_name == event.model), None)
        if model is not None:
            each_record([model], "record a swap of", lambda m: self._record_swap(m, event))
        self.w.notify()

    def _record_swap(self, model: AgentModel, event: SwapEvent) -> None:
        gpu = self.w.gpu_uuids[model.gpu] if model.gpu is not None else None
        if event.kind is SwapKind.IN:
            model.swap_ins += 1
            model.resident_since_seconds = self.w.clock()
            if model.reason == RELOAD_TIMED_OUT:
                model.reason, model.message = model.loaded_reason()
            if self.w.metrics is not None and gpu is not None:
                self.w.metrics.observe_swap_in(
                    labels_of(model), gpu, event.seconds, model.weights_bytes
                )
            return
        idle = max(self.w.idle_seconds(model) - event.seconds, 0.0)  # at the swap's start
        model.swap_outs += 1
        model.resident_since_seconds = None
        if self.w.metrics is not None and gpu is not None:
            self.w.metrics.observe_swap_out(
                labels_of(model),
                gpu,
                reason=event.cause or "Manual",
                seconds=event.seconds,
                bytes_moved=0 if event.dropped else model.kv_cache_bytes,
                idle_seconds=idle,
            )

    async def swap_out_uid(self, uid: str, *, reason: str) -> ActionResult:
        model = self.w.records.get(uid)
        if model is None:
            return ActionResult(uid=uid, outcome="unchanged", reason="NotHeld")
        return await self.swap_out(model, reason=reason)

    async def swap_out(self, model: AgentModel, *, reason: str) -> ActionResult:
        async with self.w.lock_of(model.uid):
            return await self._swap_out(model, reason)

    async def _swap_out(self, model: AgentModel, reason: str) -> ActionResult:
        if model.policy.pinned:
            return ActionResult(
                uid=model.uid, outcome="refused", reason="Pinned", message="pinned models stay"
            )
        if model.serving is not Serving.LOADED:
            return ActionResult(uid=model.uid, outcome="unchanged", reason=str(model.serving))
        idle = self.w.idle_seconds(model)
        if model.drops:  # not the engine's swap: recorded here
            started = self.w.clock()
            # new requests wait in the gateway's queue (served after its next swap-in), as
            # for the engine's swap-out; those in flight are drained before Triton unloads
            self.holds.held_swap_outs.add(model.uid)
            try:
                await self.holds.drain(model, DROP)
                await self.w.loader.unload(model, release_source=False)
                lifecycle.dropped(model)
            finally:
                self.holds.held_swap_outs.discard(model.uid)
            self._record_swap(
                model,
                SwapEvent(
                    model=model.triton_name,
                    kind=SwapKind.OUT,
                    seconds=self.w.clock() - started,
                    cause=reason,
                    dropped=True,
                ),
            )
            self.w.notify()
        else:
            # LOADING: a dropped model swapped in, awaiting its next request (dropped again)
            if self.w.engine_state(model) not in (EngineState.RESIDENT, EngineState.LOADING):
                return ActionResult(
                    uid=model.uid, outcome="unchanged", reason=str(self.w.engine_state(model))
                )
            try:  # recorded by `_on_swap` before this returns
                await asyncio.to_thread(self.w.engine.swap_out, model.triton_name, reason)
            except EngineError as e:
                return ActionResult(
                    uid=model.uid, outcome="refused", reason=type(e).__name__, message=str(e)
                )
        log.info("model %s swapped out (%s, idle %.1f s)", model.uid, reason, idle)
        return ActionResult(uid=model.uid, outcome="completed", reason="SwappedOut")

    async def make_room(
        self, victims: Sequence[SwapOut], *, engine_swap_in: bool, stop_at_refusal: bool = False
    ) -> tuple[list[str], tuple[SwapOut, ActionResult] | None]:
        """Carry out the victims of a swap-in or a load, whatever their `onSwapOut`: every
        victim the agent chose goes through here. With `engine_swap_in` (the swap-in is
        the engine's own, of a model it holds) a victim the engine holds is returned, to
        be handed to `engine.swap_in(victims=…)`, which swaps it out under the GPU's
        allocation lock right before it allocates; every other victim (one that unloads
        from Triton, a runtime that cannot attach; each victim of a load or of a dropped
        model's reload) is swapped out here, now (`swap_out_uid`). A refused swap-out is
        returned too, and with `stop_at_refusal` (a load counts on all of its room) ends
        the list there."""
        handed: list[str] = []
        for victim in victims:
            held = self.w.records.get(victim.uid)
            if engine_swap_in and held is not None and not held.drops:
                handed.append(held.triton_name)
                continue
            result = await self.swap_out_uid(victim.uid, reason=str(victim.reason))
            if stop_at_refusal and result.outcome == "refused":
                return handed, (victim, result)
        return handed, None

    async def swap_in(self, model: AgentModel, *, refused_by_reload: bool = False) -> ActionResult:
        """Admit (the policy's victims, or wait while bytes are under way) and swap in.

        Admission and the swap it admits are one step per GPU (`_admission_lock`, taken
        before the model's own lock): a second swap-in admitted while the first one's bytes
        are not yet charged would be granted the same free bytes, or the same victim, and
        the engine would refuse it. Waits happen with both locks released.
        `refused_by_reload` (a client's own swap-in): refused rather than queued on the
        model's lock behind a reload asked meanwhile (`_settled_swap_in`)."""
        asked = self.w.clock()
        deadline = asked + ADMISSION_WAIT_SECONDS
        while True:
            if refused_by_reload and model.uid in self.holds.reloads:
                return ActionResult(
                    uid=model.uid,
                    outcome="refused",
                    reason="Reloading",
                    message="a reload of the model is under way",
                )
            async with self._admission_lock(model), self.w.lock_of(model.uid):
                now = self.w.clock()
                result = await self._swap_in(model, may_wait=now < deadline, waited=now - asked)
            if result is not None:
                return result
            await self.w.changed(deadline - self.w.clock())  # a swap-out or load finished

    def _admission_lock(self, model: AgentModel) -> asyncio.Lock:
        gpu = model.gpu if model.gpu is not None else -1
        return self._admitting.setdefault(gpu, asyncio.Lock())

    async def _swap_in(
        self, model: AgentModel, *, may_wait: bool, waited: float
    ) -> ActionResult | None:
        """One admission and what it admits; None: the policy says wait, and time is left.
        `waited`: seconds since this swap-in was first asked for (the policy waits a while
        for a busy model to become idle before it drains one)."""
        if model.serving not in (Serving.LOADED, Serving.DROPPED):
            return ActionResult(
                uid=model.uid,
                outcome="refused",
                reason="NotLoaded",
                message=f"the model is {model.serving}: {model.message}".rstrip(": "),
            )
        admission = self.w.policy.admit(
            self.w.view(), model.uid, waited_seconds=waited if may_wait else None
        )
        if admission.outcome is AdmissionOutcome.WAIT and may_wait:
            return None
        if admission.reason == "AlreadyResident":
            return ActionResult(uid=model.uid, outcome="unchanged", reason="AlreadyResident")
        if admission.outcome is not AdmissionOutcome.ADMIT:
            return ActionResult(
                uid=model.uid,
                outcome="refused",
                reason=admission.reason,
                message=admission.message,
            )
        handed, _refused = await self.make_room(
            admission.victims, engine_swap_in=model.serving is Serving.LOADED
        )
        if model.serving is Serving.DROPPED:  # a reload, not the engine's swap: recorded here
            started = self.w.clock()
            lifecycle.reloading_dropped(model)
            await self.w.load_locked(model)
            if not lifecycle.is_loaded(model):  # the load may have failed
                return ActionResult(
                    uid=model.uid, outcome="refused", reason=model.reason, message=model.message
                )
            self._record_swap(
                model,
                SwapEvent(
                    model=model.triton_name, kind=SwapKind.IN, seconds=self.w.clock() - started
                ),
            )
        else:
            try:  # recorded by `_on_swap` (victims too) before this returns
                await asyncio.to_thread(self.w.engine.swap_in, model.triton_name, handed)
            except EngineError as e:
                return ActionResult(
                    uid=model.uid, outcome="refused", reason=type(e).__name__, message=str(e)
                )
        return ActionResult(uid=model.uid, outcome="completed", reason="SwappedIn")
