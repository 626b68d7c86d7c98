"""`AgentBackend`: the control API's `NodeBackend` over the real engine, sources and Triton.

`converge` answers at once: per entry it takes the effective policy the entry carries
(`policy`, computed once by the sender; the agent keeps no policy defaults),
updates a held model's policy in place (the engine's pinned/priority/KV mode too), and
places a new one (`placement.place`): `applied` when a GPU admits it (the load then runs
in the background and shows in `models()`), `deferred` with the reason when none does.
Loads, reloads and retries of deferred or failed entries continue in the policy loop.

The desired entries are saved (`desired.json`, taken back by a restarted agent) when the
control layer asks, once per change (`save_desired`): a snapshot taken at once, written
in the background by a `DesiredFileWriter`, never while the caller waits holding its lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Sequence
from pathlib import Path

from modelswap_api.control import (
    ActionResult,
    DesiredEntry,
    EntryResult,
    ModelInfo,
    NodeInfo,
    Outcome,
)
from modelswap_api.errors import PolicyError
from modelswap_api.models import EffectivePolicyStatus, Link
from modelswap_api.policy import EffectivePolicy
from modelswap_sidecar.agent.core import instances, lifecycle
from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.instances import instance_key
from modelswap_sidecar.agent.core.isolation import FAULT_REASON, fault_message, note_fault
from modelswap_sidecar.agent.core.knowledge import DesiredKnowledge
from modelswap_sidecar.agent.core.loading import engine_config
from modelswap_sidecar.agent.core.model_changes import changed_fields, refusal
from modelswap_sidecar.agent.core.placement import Placement
from modelswap_sidecar.agent.core.records import AgentModel, answers
from modelswap_sidecar.agent.ports import reports
from modelswap_sidecar.agent.ports.desired_file import DesiredFileWriter, Write, save_entries
from modelswap_sidecar.control.errors import UnknownModelError
from modelswap_sidecar.engine.errors import EngineError, UnknownModel
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.triton.naming import triton_model_name

log = logging.getLogger(__name__)

_TAKE = "take the desired entry of"


#: How often a rollout looks again at the new instance (it also wakes on every change).
_WATCH_SECONDS = 1.0
#: Longest wait for the old instance's requests in flight before it is released.
_DRAIN_SECONDS = 30.0

#: Entries taken per turn of the event loop (each costs about a millisecond or two).
_ENTRIES_PER_TURN = 16


@functools.lru_cache(maxsize=256)
def _policy_from_status(status: EffectivePolicyStatus) -> EffectivePolicy:
    """`EffectivePolicy.from_status`, once per distinct status: its schema check costs
    milliseconds, and the entries of one set mostly share a policy. A refusal raises each
    time (not cached)."""
    return EffectivePolicy.from_status(status)


def _result(uid: str, outcome: Outcome, reason: str, message: str = "") -> EntryResult:
    return EntryResult(uid=uid, outcome=outcome, reason=reason, message=message or None)


class AgentBackend:
    def __init__(
        self,
        actuator: Actuator,
        *,
        node_name: str,
        agent_version: str,
        desired_file: Path,
        knowledge: DesiredKnowledge | None = None,
        gpu_products: Sequence[str] | None = None,
        gpu_links: Sequence[Link] | None = None,
        write_desired: Write = save_entries,
    ) -> None:
        self.actuator = actuator
        self.node_name = node_name
        self.agent_version = agent_version
        self.desired_file = desired_file
        self.desired_writer = DesiredFileWriter(desired_file, write_desired)
        #: whether the agent knows its desired models: told once a set is taken (the
        #: gateway's readiness and its 404 wait for it; `run` adds the saved set)
        self.knowledge = knowledge if knowledge is not None else DesiredKnowledge()
        #: per GPU, for `GET /v1/node` (None: sim GPUs, link kind sim)
        self.gpu_products = gpu_products
        self.gpu_links = gpu_links
        #: ModelDeployments whose rollout a task watches (`_watch`): an instance taken
        #: back with older ones beside it (a restart mid-rollout) gets one on its next push
        self._rolling: set[str] = set()

    @property
    def records(self) -> dict[str, AgentModel]:
        return self.actuator.records

    @staticmethod
    def policy_of(entry: DesiredEntry) -> EffectivePolicy:
        """The entry's effective policy as its sender merged it (the operator, from the
        cluster defaults it is configured with); PolicyError naming the field."""
        return _policy_from_status(entry.policy)

    # -- NodeBackend ---------------------------------------------------------------------------

    async def converge(self, entries: Sequence[DesiredEntry]) -> Sequence[EntryResult]:
        results = []
        for i, entry in enumerate(entries):
            results.append(await self._take_guarded(entry))
            if i % _ENTRIES_PER_TURN == _ENTRIES_PER_TURN - 1:
                # the gateway and the control API answer between slices of a large set
                await asyncio.sleep(0)
        self.knowledge.pushed()
        return results

    async def _take_guarded(self, entry: DesiredEntry) -> EntryResult:
        """`_take`, with an unexpected failure kept to this entry: `conflict` with reason
        `AgentError` (the record, if one was made, is reported Failed), the rest go on."""
        try:
            result = await self._take(entry)
        except Exception as e:
            model = self._record_of(entry)
            if model is not None:
                note_fault(model, _TAKE, e)
                message = fault_message(model)
            else:
                log.error("desired entry %s: failed to take it", entry.uid, exc_info=e)
                message = f"the agent failed to take this entry ({type(e).__name__})"
            return _result(entry.uid, "conflict", FAULT_REASON, message)
        model = self._record_of(entry)
        if model is not None:
            model.faults.pop(_TAKE, None)
        return result

    def _record_of(self, entry: DesiredEntry) -> AgentModel | None:
        try:
            return self.records.get(instance_key(entry.uid, entry.model_generation))
        except ValueError:
            return None

    async def _take(self, entry: DesiredEntry) -> EntryResult:
        try:
            key = instance_key(entry.uid, entry.model_generation)
            triton_model_name(key)
        except ValueError:
            message = "uid: not a UUID; the node cannot hold it"
            return _result(entry.uid, "conflict", "InvalidUid", message)
        gpus = self.actuator.gpu_uuids
        if entry.gpu is not None and entry.gpu not in gpus:
            return _result(entry.uid, "conflict", "UnknownGpu", f"no GPU {entry.gpu} on this node")
        try:
            policy = self.policy_of(entry)
        except PolicyError as e:
            return _result(entry.uid, "conflict", "PolicyInvalid", str(e))
        model = self.records.get(key)
        if model is None:
            older = self.instances_of(entry.uid)
            model = lifecycle.hold(self.records, entry, policy)
            if older:
                return await self._roll_out(model, older)
            return self._place_new(model)
        if model.superseded:  # the set went back to this model generation
            others = [m for m in self.instances_of(entry.uid) if m is not model]
            if not answers(model):  # it serves nothing: taken as a new instance
                await self.actuator.forget(model)
                model = lifecycle.hold(self.records, entry, policy)
                return await self._roll_out(model, others) if others else self._place_new(model)
            model.superseded = False
            for other in others:
                other.superseded = True
            self._note(model, others, instances.ROLLING_OUT, "back to this model generation")
            self._watch(model, others)
        elif entry.uid not in self._rolling:  # readopted mid-rollout: it goes on
            others = [m for m in self.instances_of(entry.uid) if m is not model]
            if others:
                for other in others:
                    other.superseded = True
                self._note(model, others, instances.ROLLING_OUT, "taken back after a restart")
                self._watch(model, others)
        return await self._update(model, entry, policy)

    def instances_of(self, uid: str) -> list[AgentModel]:
        """The ModelDeployment's instances held (every model generation), newest first."""
        held = [m for m in self.records.values() if m.deployment_uid == uid]
        return sorted(held, key=lambda m: -m.model_generation)

    def current_of(self, uid: str) -> AgentModel | None:
        """The instance that serves the ModelDeployment now (`instances.chosen`)."""
        held = self.instances_of(uid)
        return instances.chosen(held, answers, lambda m: not m.superseded) if held else None

    # -- rollouts (docs/AGENT.md, "Model instances") -----------------------------------------

    async def _roll_out(self, model: AgentModel, older: list[AgentModel]) -> EntryResult:
        """A new model generation of a held ModelDeployment: `model` loads beside the older
        instances, which serve until it answers and are then drained and released; where
        the GPU has no room for both, the older ones are released first (a bounded
        interruption: requests wait for the new load as during a swap-in)."""
        for old in older:
            old.superseded = True
        holding = [old for old in older if self._holds(old)]
        for old in older:
            if old not in holding:  # holds nothing (pending, deferred, failed): gone now
                await self.actuator.forget(old)
        self._note(model, older, None)
        if not holding:
            return self._place_new(model)
        decision = self.actuator.try_place(model)
        held = {old.uid for old in holding}
        if isinstance(decision, Placement) and not any(v.uid in held for v in decision.victims):
            self._note(model, holding, instances.ROLLING_OUT, "loading beside the old model")
            self.actuator.start_load(model, decision)
            self._watch(model, holding)
            return _result(model.deployment_uid, "applied", instances.ROLLING_OUT, decision.message)
        why = decision.message if not isinstance(decision, Placement) else "the old model's room"
        message = (
            f"no room for both model generations on this node ({why}); the old model "
            f"generation is released first and requests wait for the new one"
        )
        self._note(model, holding, instances.ROLLOUT_INTERRUPTS, message)
        model.reason, model.message = instances.ROLLOUT_INTERRUPTS, message
        self._rolling.add(model.deployment_uid)
        self.actuator.spawn(self._interrupt(model, holding), f"rollout-{model.uid}")
        return _result(model.deployment_uid, "applied", instances.ROLLOUT_INTERRUPTS, message)

    def _note(
        self, model: AgentModel, older: list[AgentModel], reason: str | None, message: str = ""
    ) -> None:
        note = None
        if reason is not None:
            gens = ", ".join(str(o.model_generation) for o in older)
            note = instances.RolloutNote(
                reason=reason,
                model_generation=model.model_generation,
                message=f"model generation {gens} -> {model.model_generation}: {message}",
            )
        for instance in (model, *older):
            instance.rollout = note

    def _watch(self, model: AgentModel, older: list[AgentModel]) -> None:
        self._rolling.add(model.deployment_uid)
        self.actuator.spawn(self._release_when_served(model, older), f"rollout-{model.uid}")

    def _replaced(self, model: AgentModel) -> bool:
        """`model` is no longer the instance the set wants (a later edit, or deleted)."""
        return self.records.get(model.uid) is not model or model.superseded or not model.desired

    async def _release_when_served(self, model: AgentModel, older: list[AgentModel]) -> None:
        try:
            await self._release_when_served_once(model, older)
        finally:
            if not any(m.superseded for m in self.instances_of(model.deployment_uid)):
                self._rolling.discard(model.deployment_uid)

    async def _release_when_served_once(self, model: AgentModel, older: list[AgentModel]) -> None:
        """Once `model` answers: the gateway routes to it (`instances.chosen`), the older
        instances finish the requests they hold (at most `_DRAIN_SECONDS`) and are released
        (out of Triton, their engine record and host-store bytes deleted)."""
        while not answers(model):
            if self._replaced(model):
                return
            note = model.rollout
            if model.serving is Serving.FAILED and note and note.reason != instances.ROLLOUT_FAILED:
                why = f"{model.reason}: {model.message}".rstrip(": ")
                message = f"the new model failed ({why}); the old one serves"
                self._note(model, older, instances.ROLLOUT_FAILED, message)
            await self.actuator.changed(_WATCH_SECONDS)
        deadline = self.actuator.clock() + _DRAIN_SECONDS
        while any(o.active_requests for o in older) and self.actuator.clock() < deadline:
            await self.actuator.changed(_WATCH_SECONDS)
        await self._release(older)
        if not self._replaced(model):
            self._note(model, [], None)
        log.info(
            "model %s: model generation %d serves; older instances released",
            model.deployment_uid,
            model.model_generation,
        )

    async def _release(self, older: list[AgentModel]) -> None:
        for old in older:
            if self.records.get(old.uid) is old and old.superseded:
                await self.actuator.forget(old)
        self.actuator.notify()

    async def _interrupt(self, model: AgentModel, older: list[AgentModel]) -> None:
        """No room for both: the older instances go first, then `model` is placed (and
        loads, or waits for room as any deferred model)."""
        try:
            await self._release(older)
        finally:
            if not any(m.superseded for m in self.instances_of(model.deployment_uid)):
                self._rolling.discard(model.deployment_uid)
        if self._replaced(model):
            return
        self.actuator.spawn(self._clear_note_when_served(model), f"rollout-note-{model.uid}")
        # the policy loop may have tried it meanwhile (deferred while the old one held the
        # room, or already loading): placed now that the room is free, unless under way
        if model.serving in (Serving.PENDING, Serving.DEFERRED):
            result = self._place_new(model)
            log.info("model %s: rolled out with an interruption (%s)", model.deployment_uid,
                     result.reason)  # fmt: skip
        self.actuator.notify()

    async def _clear_note_when_served(self, model: AgentModel) -> None:
        while not answers(model) and not self._replaced(model):
            await self.actuator.changed(_WATCH_SECONDS)
        if not self._replaced(model):
            model.rollout = None

    def _place_new(self, model: AgentModel) -> EntryResult:
        decision = self.actuator.try_place(model)
        if isinstance(decision, Placement):
            self.actuator.start_load(model, decision)
            return _result(model.deployment_uid, "applied", "Loading", decision.message)
        lifecycle.defer(model, decision.reason, decision.message)
        return _result(model.deployment_uid, "deferred", decision.reason, decision.message)

    async def _update(
        self, model: AgentModel, entry: DesiredEntry, policy: EffectivePolicy
    ) -> EntryResult:
        changed = changed_fields(model.entry.spec.model, entry.spec.model)
        if changed and self._holds(model):
            gpu = self.actuator.gpu_uuids[model.gpu] if model.gpu is not None else None
            return refusal(model.deployment_uid, changed, f"{model.serving} on GPU {gpu}")
        model.entry, model.policy = entry, policy
        if model.gpu is not None and model.attaches:
            try:
                await asyncio.to_thread(self.actuator.engine.add_model, engine_config(model))
            except UnknownModel:
                pass
            except EngineError as e:
                log.warning("model %s: engine refused the new policy: %s", model.uid, e)
        if not model.desired or model.serving is Serving.UNLOADED:
            model.desired = True
            lifecycle.pending(model)
            return self._place_new(model)
        if model.serving is Serving.FAILED:
            if model.failed_generation != entry.generation:
                return self._place_new(model)
            return _result(model.deployment_uid, "deferred", model.reason, model.message)
        if model.serving is Serving.PENDING and model.reason == instances.ROLLOUT_INTERRUPTS:
            # the older instance is still being released (`_interrupt` places it next)
            return _result(model.deployment_uid, "applied", model.reason, model.message)
        if model.serving in (Serving.PENDING, Serving.DEFERRED):
            return self._place_new(model)
        if model.rollout is not None:
            reason = model.rollout.reason
            return _result(model.deployment_uid, "applied", reason, model.rollout.message)
        return _result(
            model.deployment_uid, "applied", "Updated", f"{model.serving} on GPU {model.gpu}"
        )

    def _holds(self, model: AgentModel) -> bool:
        """Triton serves (or loads) the model, or the engine keeps bytes of it."""
        if model.serving in (Serving.LOADED, Serving.LOADING, Serving.DROPPED, Serving.UNLOADING):
            return True
        status = reports.status_of(self.actuator.engine, model)
        if status is not None and status.resident_bytes > 0:
            return True
        return reports.host_bytes_of(self.actuator.engine, model) > 0

    async def unload(self, uid: str) -> None:
        for model in self.instances_of(uid):  # every model generation of it
            await self.actuator.unload(model)

    async def forget(self, uid: str) -> bool:
        held = self.instances_of(uid)
        for model in held:
            await self.actuator.forget(model)
        return bool(held)

    def save_desired(self) -> asyncio.Future[None]:
        """Snapshot the desired entries now; written in the background, in order. An
        instance being replaced is saved too, before the one replacing it: a restarted
        agent readopts both (`adoption`), the last of a uid as the current one, and the
        rollout goes on with the next push."""
        desired = [m for m in self.records.values() if m.desired]
        entries = [m.entry for m in desired if m.superseded]
        entries += [m.entry for m in desired if not m.superseded]
        return self.desired_writer.submit(entries)

    async def flush_desired(self) -> None:
        """Wait for every snapshot taken so far to be written (at shutdown)."""
        await self.desired_writer.flush()

    async def node_info(self) -> NodeInfo:
        return reports.node_info(
            self.actuator.engine,
            self.node_name,
            self.agent_version,
            self.actuator.gpu_uuids,
            products=self.gpu_products,
            links=self.gpu_links,
        )

    async def models(self) -> Sequence[ModelInfo]:
        engine, uuids = self.actuator.engine, self.actuator.gpu_uuids
        return reports.model_infos(engine, reports.reported(self.records.values()), uuids)

    # The actuator answers for the instance (its key); the control API names the uid asked.

    async def swap_in(self, uid: str) -> ActionResult:
        return dataclasses.replace(await self.actuator.swap_in(self._model(uid)), uid=uid)

    async def swap_out(self, uid: str) -> ActionResult:
        result = await self.actuator.swap_out(self._model(uid), reason="Manual")
        return dataclasses.replace(result, uid=uid)

    async def reload(self, uid: str, *, keep_host_copy: bool) -> ActionResult:
        result = await self.actuator.reload(
            self._model(uid), keep_host_copy=keep_host_copy, why="reload asked (control API)"
        )
        return dataclasses.replace(result, uid=uid)

    def _model(self, uid: str) -> AgentModel:
        model = self.current_of(uid)
        if model is None or not model.desired:
            raise UnknownModelError(uid)
        return model
