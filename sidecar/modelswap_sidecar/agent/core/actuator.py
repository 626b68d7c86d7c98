"""Side effects on models: place and load, swap out and in, drop, unload, forget, reload.

Every operation on one model holds that model's lock, so a policy swap-out, a manual
swap-in and an unload never overlap; the loops skip a model whose lock is held. Decisions
come from pure code (`placement.place`, the `Policy`); this module carries them out and
keeps each record's serving state, counters and times. Engine calls block (threads and
client round trips), so they run in worker threads.

Swaps are counted where they happen: the engine emits a `SwapEvent` for every swap it
completes (whoever asked: the policy loop, a manual call, the gateway, a client's own
swap-in, a victim swapped out to make room), with its real duration, and `_on_swap`
records it (the record's counters, `minResident`'s clock, the metrics); swaps the engine
does not do (a drop's unload, a reload) are recorded here. Waiters (admission that must
wait, the gateway waiting for a load) wait on `changed()`, which every swap, load and
unload sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from modelswap_api.control import ActionResult
from modelswap_api.models import Link
from modelswap_sidecar.agent.core import lifecycle
from modelswap_sidecar.agent.core.isolation import each_record
from modelswap_sidecar.agent.core.loading import ModelLoader
from modelswap_sidecar.agent.core.placement import Deferral, Placement, place
from modelswap_sidecar.agent.core.records import AgentModel, user_name_of
from modelswap_sidecar.agent.core.reload_drain import (
    DROP,
    RELOAD,
    REMOVAL,
    Purpose,
    ReloadDrain,
    drain,
)
from modelswap_sidecar.agent.core.views import GpuBudget, model_view, node_view
from modelswap_sidecar.agent.errors import LoadError
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.engine.errors import EngineError, NoCapacity, UnknownModel
from modelswap_sidecar.engine.events import SwapEvent, SwapKind
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.metrics import ModelLabels, NodeMetrics
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.decisions import AdmissionOutcome, SwapOut
from modelswap_sidecar.policy.facade import Policy
from modelswap_sidecar.policy.inputs import NodeView, Residency
from modelswap_sidecar.policy.load_order import load_order
from modelswap_sidecar.triton.errors import TritonError

log = logging.getLogger(__name__)

Clock = Callable[[], float]
#: How long a swap-in waits for swap-outs or loads under way before refusing (a client's
#: own swap-in: for the model's adoption and load too).
ADMISSION_WAIT_SECONDS = 30.0
#: Reason of a client's swap-in refused because no record holds its model.
UNKNOWN_TO_AGENT = "UnknownModel"
#: The longest a waiter sleeps between looks when nothing is signalled (a safety net: every
#: swap, load and unload signals `changed`).
_LOOK_AGAIN_SECONDS = 1.0
#: Reason of a dropped model dropped again because no request loaded its weights in time.
RELOAD_TIMED_OUT = "ReloadTimedOut"
#: A GPU's host-to-device bandwidth for scoring when its link was not measured.
UNMEASURED_LINK_BYTES_PER_SECOND = 10e9


def link_bytes_per_second(link: Link | None) -> float:
    """The measured host-to-device bandwidth of `link` (GB/s → bytes/s), else the default."""
    gbps = link.host_to_device_gbps if link is not None else None
    return gbps * 1e9 if gbps else UNMEASURED_LINK_BYTES_PER_SECOND


@dataclass
class _Reload:
    """A reload under way (`Actuator.reload`): those asked meanwhile join it."""

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


def labels_of(model: AgentModel) -> ModelLabels:
    """Its metric labels: `model` is the name users call, as the gateway's series carry it."""
    return ModelLabels(
        uid=model.uid, namespace=model.entry.namespace, name=user_name_of(model.entry)
    )


class Actuator:
    def __init__(
        self,
        *,
        engine: Engine,
        loader: ModelLoader,
        policy: Policy,
        gpu_uuids: tuple[str, ...],
        metrics: NodeMetrics | None,
        records: dict[str, AgentModel] | None = None,
        links: Sequence[Link] = (),
        retry_failed_seconds: float = 60.0,
        reload_timeout_seconds: float = 600.0,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        adopting: bool = False,
    ) -> None:
        """`records` (by UID) is the table the actuator keeps; the assembly shares it with
        the metrics' sampler, which is built before the actuator. `adopting`: a previous
        agent's models are still to be taken back (`adoption_ended` says when they are)."""
        self.engine = engine
        self.loader = loader
        self.policy = policy
        self.gpu_uuids = gpu_uuids
        self.metrics = metrics
        self.clock = clock
        self.wall_clock = wall_clock
        self.records: dict[str, AgentModel] = {} if records is None else records
        #: adoption has not ended: a client's swap-in of a name no record holds waits
        self.adopting = adopting
        #: How long a failed load waits before the next try (same generation).
        self.retry_failed_seconds = retry_failed_seconds
        #: How long a dropped model swapped in may wait for the request that loads its
        #: weights before it is dropped again (`end_stalled_reloads`).
        self.reload_timeout_seconds = reload_timeout_seconds
        #: per GPU ordinal: what the policy scores a swap-in's cost with
        self.link_bytes_per_second = tuple(
            link_bytes_per_second(links[i] if i < len(links) else None)
            for i in range(len(gpu_uuids))
        )
        self._locks: dict[str, asyncio.Lock] = {}
        self._admitting: dict[int, asyncio.Lock] = {}  # per GPU ordinal: see `swap_in`
        self._tasks: set[asyncio.Task[None]] = set()
        #: The node view one `reconcile` pass places against: made at its first placement
        #: and again after each load it starts (a deferral changes nothing in it), so a pass
        #: over n waiting models builds one view, not n (each is O(n): 500 deferred models
        #: took seconds of the event loop per pass).
        self._placing: NodeView | None = None
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: by UID: why the agent ended the model's runtime process (`agent/core/
        #: unresponsive.py`), said when the model is loaded again (`ProcessUnresponsive`)
        self.ended_runtimes: dict[str, str] = {}
        #: by UID: the reload under way, which later ones join
        self._reloads: dict[str, _Reload] = {}
        #: how an unload from Triton (a reload, a removal, a drop-style swap-out) drains
        #: the model's requests first (the gateway's, `drain_reloads_with`); None: no
        #: gateway, nothing in flight to drain
        self.reload_drain: ReloadDrain | None = None
        #: UIDs whose requests a drain waits for now (`_drain`)
        self._draining: set[str] = set()
        #: UIDs a drop-style swap-out holds (new requests queue) while it drains and unloads
        self._held_swap_outs: set[str] = set()

    # -- swap events and waiting -------------------------------------------------------------

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Record the engine's swaps on `loop`, and decide its clients' own swap-ins there
        (`decide_client_swap_in`; call once, from it)."""
        self._loop = loop
        self.engine.subscribe(self._from_engine)

    def adoption_ended(self) -> None:
        """The models a previous agent held are taken back (`adoption.adopt`, each held or
        left out): a client's swap-in of a name held by no record is refused from now on."""
        self.adopting = False
        self.notify()

    def decide_client_swap_in(self, name: str) -> None:
        """The engine's decider (`engine.core.SwapInDecider`), on the engine's thread
        serving a client's own swap-in request (its `in_use()` found the model swapped
        out): decided as any other swap-in (`swap_in`, the policy's admission), on the
        loop. A model still being adopted is waited for (bounded), then admitted; a name
        this agent does not hold is refused. A refusal is an EngineError the client
        receives."""
        loop = self._loop
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

    async def _client_swap_in(self, name: str) -> ActionResult:
        deadline = self.clock() + ADMISSION_WAIT_SECONDS
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
            model = next((m for m in self.records.values() if m.triton_name == name), None)
            if model is not None or not self.adopting or self.clock() >= deadline:
                return model
            await self.changed(deadline - self.clock())

    async def _settled_swap_in(self, model: AgentModel, deadline: float) -> ActionResult:
        """`swap_in`, once a load under way (an adoption) has finished. A client's own
        swap-in holds a request at Triton (its `in_use()`), so it never waits on the
        model's lock behind a reload, whose unload would wait for that request in turn:
        while a reload is asked or drains it waits here, and goes on at once if the model
        is resident by then (another swap-in brought it back); once the reload unloads the
        model it is refused (the reload's drain has ended the request at the gateway)."""
        while self.clock() < deadline:
            if self.engine_state(model) is EngineState.RESIDENT:
                return ActionResult(uid=model.uid, outcome="unchanged", reason="AlreadyResident")
            if (refused := self._reload_refusal(model)) is not None:
                return refused
            if model.uid in self._draining and not model.desired:
                # a removal drains it: swapping it in for a request it then ends is waste
                return ActionResult(
                    uid=model.uid,
                    outcome="refused",
                    reason="Removed",
                    message="the model is being removed from this node",
                )
            if model.uid not in self._reloads and model.serving is not Serving.LOADING:
                break
            await self.changed(deadline - self.clock())
        return await self.swap_in(model, refused_by_reload=True)

    def _reload_refusal(self, model: AgentModel) -> ActionResult | None:
        """A client's own swap-in's refusal while a reload unloads the model."""
        under_way = self._reloads.get(model.uid)
        if under_way is None or not under_way.unloading:
            return None
        return ActionResult(
            uid=model.uid,
            outcome="refused",
            reason="Reloading",
            message="the model is being unloaded for a reload",
        )

    def _from_engine(self, event: SwapEvent) -> None:
        """On the engine's thread: hand the event to the loop (before the engine call that
        made it returns, so its caller resumes with the swap recorded)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._on_swap, event)

    def _on_swap(self, event: SwapEvent) -> None:
        model = next((m for m in self.records.values() if m.triton_name == event.model), None)
        if model is not None:
            each_record([model], "record a swap of", lambda m: self._record_swap(m, event))
        self.notify()

    def _record_swap(self, model: AgentModel, event: SwapEvent) -> None:
        gpu = self.gpu_uuids[model.gpu] if model.gpu is not None else None
        if event.kind is SwapKind.IN:
            model.swap_ins += 1
            model.resident_since_seconds = self.clock()
            if model.reason == RELOAD_TIMED_OUT:
                model.reason, model.message = model.loaded_reason()
            if self.metrics is not None and gpu is not None:
                self.metrics.observe_swap_in(
                    labels_of(model), gpu, event.seconds, model.weights_bytes
                )
            return
        idle = max(self._idle_seconds(model) - event.seconds, 0.0)  # at the swap's start
        model.swap_outs += 1
        model.resident_since_seconds = None
        if self.metrics is not None and gpu is not None:
            self.metrics.observe_swap_out(
                labels_of(model),
                gpu,
                reason=event.cause or "Manual",
                seconds=event.seconds,
                bytes_moved=0 if event.dropped else model.kv_cache_bytes,
                idle_seconds=idle,
            )

    def notify(self) -> None:
        """Something waiters may wait for happened (a swap, a load, an unload)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout_seconds: float) -> None:
        """Return at the next `notify`, or after `timeout_seconds` (at most a second)."""
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), min(timeout_seconds, _LOOK_AGAIN_SECONDS))

    # -- what the decisions read -------------------------------------------------------------

    def lock_of(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())

    def busy(self, uid: str) -> bool:
        return self.lock_of(uid).locked()

    def ordinal_of(self, uuid: str) -> int:
        return self.gpu_uuids.index(uuid)

    def gpu_budgets(self) -> list[GpuBudget]:
        return [
            GpuBudget(
                ordinal=i,
                uuid=u,
                budget_bytes=self.engine.budget(i).budget_bytes,
                host_to_device_bytes_per_second=self.link_bytes_per_second[i],
            )
            for i, u in enumerate(self.gpu_uuids)
        ]

    def engine_states(self) -> dict[str, EngineState]:
        return {s.name: s.state for s in self.engine.statuses()}

    def view(self) -> NodeView:
        return node_view(
            list(self.records.values()), self.engine_states(), self.gpu_budgets(), self.clock()
        )

    def engine_state(self, model: AgentModel) -> EngineState | None:
        try:
            return self.engine.state(model.triton_name)
        except UnknownModel:
            return None

    # -- background work ---------------------------------------------------------------------

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- placing and loading -----------------------------------------------------------------

    def candidate_gpus(self, model: AgentModel) -> list[str]:
        """The operator's GPU, else the GPU the engine keeps host copies for, else all."""
        if model.entry.gpu is not None:
            return [model.entry.gpu]
        if model.gpu is not None:
            return [self.gpu_uuids[model.gpu]]
        try:
            return [self.gpu_uuids[self.engine.gpu_of(model.triton_name)]]
        except UnknownModel:
            return list(self.gpu_uuids)

    def try_place(
        self, model: AgentModel, *, fenced: bool = False, view: NodeView | None = None
    ) -> Placement | Deferral:
        """Where `model` can load now, or why not. `fenced`: the control service's fencing
        holds (nothing new is loaded); `view`: the node as it is now, when the caller has it."""
        now = self.clock()
        if fenced:
            return Deferral(
                reason="Fenced",
                message="Lease renewals and operator pushes have both failed for the grace "
                "period; nothing new is loaded",
            )
        candidate = model_view(model, Residency.SWAPPED_OUT, self.candidate_gpus(model)[0], now)
        node = view if view is not None else self.view()
        return place(node, candidate, self.candidate_gpus(model), now, self.policy.settings)

    def start_load(self, model: AgentModel, placement: Placement) -> None:
        lifecycle.place(model, self.ordinal_of(placement.gpu), placement.message)
        self.spawn(self._load(model, placement.victims), f"load-{model.uid}")

    async def _load(self, model: AgentModel, victims: tuple[SwapOut, ...]) -> None:
        async with self.lock_of(model.uid):
            for victim in victims:
                result = await self.swap_out_uid(victim.uid, reason=str(victim.reason))
                if result.outcome == "refused":
                    # The room this load counted on is still taken: loading now would
                    # over-commit the GPU and fail (LoadFailed until the retry). The model
                    # waits for the next placement, which weighs the victims again.
                    lifecycle.defer(
                        model,
                        "WaitingForRoom",
                        f"{victim.uid} did not give up its room ({result.reason}"
                        f"{': ' + result.message if result.message else ''}); placed again next",
                    )
                    log.info("model %s waits: %s", model.uid, model.message)
                    self.notify()
                    return
            await self._load_locked(model)

    async def _load_locked(self, model: AgentModel) -> None:
        try:
            await self._load_unnotified(model)
        finally:
            self.notify()

    async def _load_unnotified(self, model: AgentModel) -> None:
        started = self.clock()
        try:
            await self.loader.load(model)
        except LoadError as e:
            log.warning("model %s (%s): %s", model.uid, model.entry.name, e.message)
            lifecycle.fail(model, e.reason, e.message, self.clock())
            return
        lifecycle.loaded(model, self.clock())
        if self.metrics is not None:
            self.metrics.observe_load(labels_of(model), self.clock() - started)
        log.info(
            "model %s/%s (uid %s) serving on GPU %s",
            model.entry.namespace,
            model.entry.name,
            model.uid,
            model.gpu,
        )

    def reconcile(self, *, fenced: bool = False, order: Sequence[AgentModel] = ()) -> None:
        """Place every desired model that waits for a place (pending, deferred, failed and
        due for a retry), those in `order` first and in that order, then the others in the
        policy's `load_order` (pinned first, then by priority: a model deferred after a
        Triton restart is placed before less important ones on later ticks too); while
        `fenced`, each is deferred instead."""
        now = self.clock()
        self._placing = None  # this pass's view, made at its first placement
        first = {m.uid for m in order}
        rest = load_order(
            (m for m in self.records.values() if m.uid not in first), lambda m: m.policy
        )
        models = [*order, *rest]
        each_record(models, "place", lambda model: self._reconcile(model, now, fenced))

    def _reconcile(self, model: AgentModel, now: float, fenced: bool) -> None:
        if not model.desired or self.busy(model.uid):
            return
        if model.serving is Serving.FAILED:
            due = (model.failed_at_seconds or 0.0) + self.retry_failed_seconds
            if now < due and model.failed_generation == model.entry.generation:
                return
        elif model.serving not in (Serving.PENDING, Serving.DEFERRED):
            return
        if self._placing is None:
            self._placing = self.view()
        decision = self.try_place(model, fenced=fenced, view=self._placing)
        if isinstance(decision, Placement):
            self._placing = None  # the load claims HBM: the next placement sees it
            self.start_load(model, decision)
        else:
            lifecycle.defer(model, decision.reason, decision.message)

    # -- swaps -------------------------------------------------------------------------------

    async def swap_out_uid(self, uid: str, *, reason: str) -> ActionResult:
        model = self.records.get(uid)
        if model is None:
            return ActionResult(uid=uid, outcome="unchanged", reason="NotHeld")
        return await self.swap_out(model, reason=reason)

    async def swap_out(self, model: AgentModel, *, reason: str) -> ActionResult:
        async with self.lock_of(model.uid):
            return await self._swap_out(model, reason)

    async def _swap_out(self, model: AgentModel, reason: str) -> ActionResult:
        if model.policy.pinned:
            return ActionResult(
                uid=model.uid, outcome="refused", reason="Pinned", message="pinned models stay"
            )
        if model.serving is not Serving.LOADED:
            return ActionResult(uid=model.uid, outcome="unchanged", reason=str(model.serving))
        idle = self._idle_seconds(model)
        if model.drops:  # not the engine's swap: recorded here
            started = self.clock()
            # new requests wait in the gateway's queue (served after its next swap-in), as
            # for the engine's swap-out; those in flight are drained before Triton unloads
            self._held_swap_outs.add(model.uid)
            try:
                await self._drain(model, DROP)
                await self.loader.unload(model, release_source=False)
                lifecycle.dropped(model)
            finally:
                self._held_swap_outs.discard(model.uid)
            self._record_swap(
                model,
                SwapEvent(
                    model=model.triton_name,
                    kind=SwapKind.OUT,
                    seconds=self.clock() - started,
                    cause=reason,
                    dropped=True,
                ),
            )
            self.notify()
        else:
            # LOADING: a dropped model swapped in, awaiting its next request (dropped again)
            if self.engine_state(model) not in (EngineState.RESIDENT, EngineState.LOADING):
                return ActionResult(
                    uid=model.uid, outcome="unchanged", reason=str(self.engine_state(model))
                )
            try:  # recorded by `_on_swap` before this returns
                await asyncio.to_thread(self.engine.swap_out, model.triton_name, reason)
            except EngineError as e:
                return ActionResult(
                    uid=model.uid, outcome="refused", reason=type(e).__name__, message=str(e)
                )
        log.info("model %s swapped out (%s, idle %.1f s)", model.uid, reason, idle)
        return ActionResult(uid=model.uid, outcome="completed", reason="SwappedOut")

    def _idle_seconds(self, model: AgentModel) -> float:
        marks = [t for t in (model.last_request_seconds, model.resident_since_seconds) if t]
        return max(self.clock() - max(marks), 0.0) if marks else 0.0

    async def swap_in(self, model: AgentModel, *, refused_by_reload: bool = False) -> ActionResult:
        """Admit (the policy's victims, or wait while bytes are under way) and swap in.

        Admission and the swap it admits are one step per GPU (`_admission_lock`, taken
        before the model's own lock): a second swap-in admitted while the first one's bytes
        are not yet charged would be granted the same free bytes, or the same victim, and
        the engine would refuse it. Waits happen with both locks released.
        `refused_by_reload` (a client's own swap-in): refused rather than queued on the
        model's lock behind a reload asked meanwhile (`_settled_swap_in`)."""
        asked = self.clock()
        deadline = asked + ADMISSION_WAIT_SECONDS
        while True:
            if refused_by_reload and model.uid in self._reloads:
                return ActionResult(
                    uid=model.uid,
                    outcome="refused",
                    reason="Reloading",
                    message="a reload of the model is under way",
                )
            async with self._admission_lock(model), self.lock_of(model.uid):
                now = self.clock()
                result = await self._swap_in(model, may_wait=now < deadline, waited=now - asked)
            if result is not None:
                return result
            await self.changed(deadline - self.clock())  # a swap-out or load finished

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
        admission = self.policy.admit(
            self.view(), model.uid, waited_seconds=waited if may_wait else None
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
        # Victims the engine swaps out (under the GPU's allocation lock, right before it
        # allocates) are handed to it; the others (a drop's unload) go first, here.
        handed: list[str] = []
        for victim in admission.victims:
            held = self.records.get(victim.uid)
            if held is not None and model.serving is Serving.LOADED and not held.drops:
                handed.append(held.triton_name)
            else:
                await self.swap_out_uid(victim.uid, reason=str(victim.reason))
        if model.serving is Serving.DROPPED:  # a reload, not the engine's swap: recorded here
            started = self.clock()
            lifecycle.reloading_dropped(model)
            await self._load_locked(model)
            if not lifecycle.is_loaded(model):  # the load may have failed
                return ActionResult(
                    uid=model.uid, outcome="refused", reason=model.reason, message=model.message
                )
            self._record_swap(
                model,
                SwapEvent(
                    model=model.triton_name, kind=SwapKind.IN, seconds=self.clock() - started
                ),
            )
        else:
            try:  # recorded by `_on_swap` (victims too) before this returns
                await asyncio.to_thread(self.engine.swap_in, model.triton_name, handed)
            except EngineError as e:
                return ActionResult(
                    uid=model.uid, outcome="refused", reason=type(e).__name__, message=str(e)
                )
        return ActionResult(uid=model.uid, outcome="completed", reason="SwappedIn")

    # -- unloading ---------------------------------------------------------------------------

    async def unload(self, model: AgentModel) -> None:
        """Missing from the set past the grace period (or forgotten, `forget`): out of
        Triton, host bytes kept. A loaded model drains first (`reload_drain`, `REMOVAL`).
        Not desired from the start: new requests are answered as once it is gone (404, the
        gateway routes it no more) rather than held for a model that will not return."""
        async with self.lock_of(model.uid):
            model.desired = False
            if model.serving is Serving.LOADED:
                await self._drain(model, REMOVAL)
            if model.serving in (Serving.LOADED, Serving.LOADING, Serving.DROPPED):
                lifecycle.unloading(model)
                started = self.clock()
                await self.loader.unload(model)
                if self.metrics is not None:
                    self.metrics.observe_unload(labels_of(model), self.clock() - started)
            elif model.resolved is not None:
                self.loader.resolver.release(model.resolved)
                model.resolved = None
            lifecycle.unloaded(model)
        self.notify()

    async def forget(self, model: AgentModel) -> None:
        """Unload and delete everything held for the model, host-store bytes included."""
        await self.unload(model)
        async with self.lock_of(model.uid):
            remove = getattr(self.engine, "remove_model", None)
            if remove is not None:
                with contextlib.suppress(UnknownModel):
                    await asyncio.to_thread(remove, model.triton_name)
            else:
                log.warning(
                    "model %s: this engine cannot remove models; its host copy stays until "
                    "host-store pressure evicts it",
                    model.uid,
                )
            self.records.pop(model.uid, None)
            if self.metrics is not None:
                self.metrics.forget_model(labels_of(model))

    # -- dev models (local mode's dev loop) -------------------------------------------------

    def start_dev_clocks(self) -> None:
        """A dev model's idle clock starts once its process has committed (the engine holds
        it RESIDENT), not when it was registered: until then it has no start (the policy
        counts it idle for 0 s, and never tries to swap out a model with nothing to save)."""
        for model in self.records.values():
            if not model.dev or model.serving is not Serving.LOADED:
                continue
            state = self.engine_state(model)
            if state in (None, EngineState.LOADING):
                model.resident_since_seconds = None
            elif state is EngineState.RESIDENT and model.resident_since_seconds is None:
                model.resident_since_seconds = self.clock()

    # -- reloading from the source ---------------------------------------------------------

    def drain_reloads_with(self, reload_drain: ReloadDrain) -> None:
        """Have each unload from Triton (a reload, a removal, a drop-style swap-out) drain
        its model's requests through `reload_drain` first."""
        self.reload_drain = reload_drain

    async def _drain(self, model: AgentModel, purpose: Purpose) -> None:
        """Wait for (or end at the deadline) the model's requests in flight before an
        unload from Triton (`reload_drain.drain`)."""
        if self.reload_drain is None:
            return
        self._draining.add(model.uid)
        try:
            await drain(
                model, self.reload_drain, clock=self.clock, changed=self.changed, purpose=purpose
            )
        finally:
            self._draining.discard(model.uid)

    def held(self, uid: str) -> bool:
        """A reload or a drop-style swap-out holds the model: its new requests wait (the
        gateway queues them)."""
        under_way = self._reloads.get(uid)
        return (under_way is not None and under_way.holding) or uid in self._held_swap_outs

    def hold_state(self, uid: str) -> str | None:
        """What holds the model, as progress lines say it: Reloading, SwappingOut."""
        under_way = self._reloads.get(uid)
        if under_way is not None and under_way.holding:
            return "Reloading"
        return "SwappingOut" if uid in self._held_swap_outs else None

    def draining(self, uid: str) -> bool:
        """A drain waits for the model's requests (or holds it): each answer should
        `notify`."""
        return uid in self._draining or self.held(uid)

    async def reload(self, model: AgentModel, *, keep_host_copy: bool, why: str) -> ActionResult:
        """Load the model again from its source (local mode: its files changed). It drains
        first, as a swap-out does (`reload_drain`): new requests are held (queued in the
        gateway, served once it is loaded again) and those in flight are waited for, at
        most `policy.drainTimeoutSeconds`, then ended (503 `DrainDeadline`). Then out of
        Triton (its processes exit; the engine keeps the host copy), the host copy
        dropped unless `keep_host_copy` (a kept copy is restored on attach, and the client
        binds it only while its layout fingerprint matches), then pending: placed and
        loaded as any model (`reconcile`, now). A failed model is retried at once.
        `unchanged` for a model that holds nothing to reload: not loaded yet (its load
        reads the files), or dropped (its next swap-in does).

        One reload per model at a time: one asked while another is under way (draining
        or unloading) joins it and is answered with its outcome; one asking to drop the
        host copy makes it drop it, unless it already kept it (then it runs after)."""
        while (under_way := self._reloads.get(model.uid)) is not None:
            if under_way.takes(keep_host_copy):
                under_way.keep_host_copy = under_way.keep_host_copy and keep_host_copy
                result = await asyncio.shield(under_way.done)
                joined = f"joined the reload under way: {result.message or result.reason}"
                return ActionResult(
                    uid=result.uid, outcome=result.outcome, reason=result.reason, message=joined
                )
            await asyncio.shield(under_way.done)
        under_way = _Reload(keep_host_copy, asyncio.get_running_loop().create_future())
        self._reloads[model.uid] = under_way
        # its own task: a caller that goes away (the control API's client) cancels only
        # its wait, never a reload that others joined or a drain half done
        self.spawn(self._run_reload(model, under_way, why), f"reload-{model.uid}")
        return await asyncio.shield(under_way.done)

    async def _run_reload(self, model: AgentModel, under_way: _Reload, why: str) -> None:
        try:
            under_way.done.set_result(await self._reload(model, under_way, why))
        except asyncio.CancelledError:  # the agent is stopping
            under_way.done.set_result(
                ActionResult(
                    uid=model.uid,
                    outcome="refused",
                    reason="ReloadInterrupted",
                    message="the agent is stopping",
                )
            )
            raise
        except Exception as e:
            under_way.done.set_exception(e)
        finally:
            under_way.holding = False
            del self._reloads[model.uid]
            self.notify()  # requests it held look again

    async def _reload(self, model: AgentModel, under_way: _Reload, why: str) -> ActionResult:
        async with self.lock_of(model.uid):
            if model.serving in (Serving.PENDING, Serving.DEFERRED, Serving.LOADING):
                return ActionResult(
                    uid=model.uid,
                    outcome="unchanged",
                    reason=str(model.serving),
                    message="not loaded yet: its load reads the source as it is now",
                )
            if model.serving is Serving.DROPPED:
                return ActionResult(
                    uid=model.uid,
                    outcome="unchanged",
                    reason=str(model.serving),
                    message="unloaded: its next swap-in loads it from the source",
                )
            if model.serving not in (Serving.LOADED, Serving.FAILED):
                return ActionResult(uid=model.uid, outcome="refused", reason=str(model.serving))
            if model.serving is Serving.LOADED:
                under_way.holding = True
                await self._drain(model, RELOAD)
                under_way.unloading = True
                self.notify()  # a client's own swap-in waiting on it is refused now
                try:
                    await self.loader.unload(model)
                except TritonError as e:
                    return ActionResult(
                        uid=model.uid, outcome="refused", reason="UnloadFailed", message=str(e)
                    )
            under_way.decided = True
            keep_host_copy = under_way.keep_host_copy
            if not keep_host_copy:
                with contextlib.suppress(UnknownModel):
                    await asyncio.to_thread(self.engine.remove_model, model.triton_name)
            model.failed_at_seconds = None
            kept = "host copy kept" if keep_host_copy else "host copy dropped"
            self._mark_for_reload(model, "Reloading", f"{why} ({kept})")
            model.message = f"{why}; loading it again ({kept})"
        # placed (LOADING) before the hold ends, so held requests wait for that load
        self.reconcile(order=[model])
        under_way.holding = False
        self.notify()
        log.info("model %s: %s; loading it again (%s)", model.uid, why, kept)
        return ActionResult(uid=model.uid, outcome="completed", reason="Reloading")

    # -- stalled reloads --------------------------------------------------------------------

    def end_stalled_reloads(self) -> int:
        """Drop again every dropped model swapped in (fresh memory mapped) whose weights no
        request has loaded for `reload_timeout_seconds`: a request that fails before the
        model runs (a wrong input name) loads nothing. The number started."""
        now = self.clock()
        return sum(
            each_record(
                self.records.values(), "end a stalled reload of", lambda m: self._stalled(m, now)
            )
        )

    def _stalled(self, model: AgentModel, now: float) -> int:
        since = model.resident_since_seconds
        if (
            model.serving is not Serving.LOADED
            or not model.attaches
            or model.dev  # its process loads its bytes when it chooses
            or since is None
            or now - since < self.reload_timeout_seconds
            or self.busy(model.uid)
            or self.engine_state(model) is not EngineState.LOADING
            or self._instances(model) == 0
        ):
            return 0
        self.spawn(self._drop_stalled(model), f"drop-stalled-{model.uid}")
        return 1

    async def _drop_stalled(self, model: AgentModel) -> None:
        before = model.reason, model.message
        # set first: the status shows the engine's Dropped as soon as the swap-out ends
        model.reason = RELOAD_TIMED_OUT
        model.message = (
            f"swapped in after a drop, but no request loaded its weights within "
            f"{self.reload_timeout_seconds:g} s (triton.loadTimeoutSeconds; a request that "
            "fails before the model runs, such as one with a wrong input name, loads "
            "nothing): dropped again, its memory released; the next request reloads it"
        )
        result = await self.swap_out(model, reason=RELOAD_TIMED_OUT)
        if result.outcome != "completed":
            model.reason, model.message = before
            log.info("model %s: stalled reload not ended: %s", model.uid, result.reason)
            return
        log.warning("model %s: %s", model.uid, model.message)

    def _instances(self, model: AgentModel) -> int:
        try:
            return self.engine.status(model.triton_name).instances
        except UnknownModel:
            return 0

    # -- model processes gone: a Triton restart, a process killed --------------------------

    def reload_gone(self) -> int:
        """Load again every loaded model whose runtime processes are all gone (killed, or
        crashed): the engine saw their sockets close and kept the host copies. Call only
        while Triton answers. The number marked."""
        return sum(each_record(self.records.values(), "reload", self._reload_if_gone))

    def _reload_if_gone(self, model: AgentModel) -> int:
        if (
            model.serving is not Serving.LOADED
            or not model.attaches
            or model.dev  # no runtime process to load: the developer's comes and goes
            or self.busy(model.uid)
            or self.engine_state(model) is None
            or self._instances(model) > 0
        ):
            return 0
        ended = self.ended_runtimes.pop(model.uid, None)
        why = ended or f"its runtime process exited: {self._engine_reason(model)}"
        reason = "ProcessUnresponsive" if ended else "ProcessExited"
        self.spawn(self._unload_gone(model, why, reason), f"unload-gone-{model.uid}")
        return 1

    async def _unload_gone(self, model: AgentModel, why: str, reason: str) -> None:
        """Out of Triton first (it would take a load of a model it still lists as a no-op,
        its dead process unreplaced), then pending: placed and loaded again. The unload is
        waited for briefly only: one that holds a request the dead process had in flight
        never ends, and Triton loads the model again beside it (issue 26, item 5)."""
        async with self.lock_of(model.uid):
            if model.serving is not Serving.LOADED:
                return
            try:
                await self.loader.unload_dead(model)
            except TritonError as e:
                log.warning("model %s: unloading its dead runtime failed: %s", model.uid, e)
            self._mark_for_reload(model, reason, why)
        self.notify()

    def _engine_reason(self, model: AgentModel) -> str:
        try:
            return self.engine.status(model.triton_name).reason
        except UnknownModel:
            return ""

    def reload_all(self) -> int:
        """Triton restarted: load again every model it served (from the host store; stubs
        restore), placed one by one as the HBM budget allows (`reconcile`: the policy picks
        victims, the rest wait and are placed on later ticks) in `_reload_order`, so a
        pinned model is never the one left without room. The number marked."""
        order = self._reload_order()
        marked = sum(each_record(order, "reload", self._reload_one))
        self.reconcile(order=order)
        return marked

    def _reload_order(self) -> list[AgentModel]:
        """The policy's `load_order` (pinned first, then by priority, highest first); among
        equals, models that were swapped out first and those that were resident last (each
        load maps the model, its attach restores it, and the last ones placed stay
        resident), then by uid (the records' order is the order they were pushed in)."""
        by_residency = sorted(
            self.records.values(), key=lambda m: (m.resident_since_seconds is not None, m.uid)
        )
        return load_order(by_residency, lambda m: m.policy)

    def _reload_one(self, model: AgentModel) -> int:
        if model.serving is Serving.FAILED:
            model.failed_at_seconds = None  # it may have failed against the dead Triton
        if (
            model.desired
            and model.serving is Serving.LOADED
            and not model.dev  # not in Triton: its process is the developer's
            and not self.busy(model.uid)
        ):
            return self._mark_for_reload(model, "Reloading", "Triton restarted")
        return 0

    def _mark_for_reload(self, model: AgentModel, reason: str, message: str) -> int:
        """Pending again (not charged to any GPU): the policy loop places and loads it."""
        lifecycle.load_again(model, reason, message)
        return 1
