"""The control API's logic, apart from HTTP: revisions, identity, grace, fencing.

`ControlService` sits between the routes and a `NodeBackend`:
- `put_desired` refuses another node's set, an older term, or an older counter within the
  same term (409); stores a newer revision before acting on it; answers `stale` for an
  entry older than the generation already taken for its uid and `conflict` for a uid that
  changed namespace or name; hands the rest to the backend; schedules every held model
  missing from the set for unload after the grace period.
- `unload_due` unloads what the grace period has run out on (the app calls it on a timer).
- `delete` forgets a model that is no longer desired, host-store bytes included.
- After each change (a set taken, a batch of unloads, a delete) the backend saves its
  desired entries once (`save_desired`): a snapshot taken under the lock, written after
  the lock is released; the answer waits for the write, not the lock.
- Until the first push after a (re)start, which models are desired is the backend's word
  (the agent keeps its last desired entries on disk and takes them back), so a restarted
  agent neither reports its held models as undesired nor lets them be deleted.
- Lease renewals (`record_lease_renewal`) and pushes feed the fencing rule; `may_load_new`
  is what the agent's loops ask before loading or swapping in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from modelswap_api.control import (
    ActionResult,
    DesiredEntry,
    DesiredSet,
    DesiredSetResult,
    EntryResult,
    ModelInfo,
    NodeInfo,
    PendingUnload,
    Revision,
)
from modelswap_sidecar.control.backend import NodeBackend
from modelswap_sidecar.control.errors import BackendError, RefusedError, UnknownModelError
from modelswap_sidecar.control.fencing import Fencing
from modelswap_sidecar.control.removals import UnloadSchedule
from modelswap_sidecar.control.revisions import RevisionStore
from modelswap_sidecar.control.settings import ControlSettings

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True)
class _Identity:
    namespace: str
    name: str
    generation: int


class ControlService:
    def __init__(
        self,
        backend: NodeBackend,
        settings: ControlSettings,
        *,
        clock: Clock,
        revisions: RevisionStore | None = None,
    ) -> None:
        self.backend = backend
        self.settings = settings
        self._clock = clock
        self._revisions = revisions or RevisionStore(settings.state_file)
        self._revision = self._revisions.load()
        self._fencing = Fencing.starting(
            clock(), settings.grace_seconds, enabled=settings.fencing_enabled
        )
        self._schedule = UnloadSchedule(settings.grace_seconds)
        self._desired: frozenset[str] = frozenset()
        #: False until a set is accepted: `_desired` is then the backend's view.
        self._pushed = False
        self._unloaded: set[str] = set()
        self._identities: dict[str, _Identity] = {}
        self._identities_seeded = False
        self._lock = asyncio.Lock()

    # --- the desired set -------------------------------------------------------------------

    @property
    def revision(self) -> Revision | None:
        """The highest revision seen (persisted across restarts)."""
        return self._revision

    async def put_desired(self, desired: DesiredSet) -> DesiredSetResult:
        async with self._lock:
            await self._accept_revision(desired)
            now = self._clock()
            self._fencing = self._fencing.pushed(now)
            results = await self._converge(desired.entries)
            held = {m.uid for m in await self.backend.models()} | self._desired
            held |= set(self._schedule.deadlines)
            self._schedule = self._schedule.observe(
                desired.uids, held - self._unloaded - desired.uids, now
            )
            self._unloaded -= desired.uids
            self._desired = desired.uids
            self._pushed = True
            saved = self.backend.save_desired()
            assert self._revision is not None
            counts = {o: sum(r.outcome == o for r in results) for o in ("applied", "deferred")}
            logger.info(
                "desired set %s: %d entries (%d applied, %d deferred, %d other), %d to unload",
                desired.revision,
                len(results),
                counts["applied"],
                counts["deferred"],
                len(results) - counts["applied"] - counts["deferred"],
                len(self._schedule.deadlines),
            )
            answer = DesiredSetResult(
                revision=self._revision,
                results=tuple(results),
                pending_unloads=self._pending_unloads(now),
            )
        await _saved(saved)
        return answer

    async def _accept_revision(self, desired: DesiredSet) -> None:
        node = self.settings.node_name
        if desired.node_name is not None and desired.node_name != node:
            raise RefusedError(
                "WrongNode", f"set is for node {desired.node_name!r}; this is {node!r}"
            )
        seen, offered = self._revision, desired.revision
        if seen is not None and offered.term < seen.term:
            raise RefusedError(
                "OlderTerm", f"revision {offered} is from an older leader term than {seen}"
            )
        if seen is not None and offered < seen:
            raise RefusedError("OlderRevision", f"revision {offered} is older than {seen}")
        if seen is None or offered > seen:
            await asyncio.to_thread(self._revisions.save, offered)
            self._revision = offered

    async def _seed_identities(self) -> None:
        """After a restart, what the backend still holds (readopted models) sets the
        identities and generations later sets are checked against."""
        if self._identities_seeded:
            return
        for model in await self.backend.models():
            self._identities.setdefault(
                model.uid, _Identity(model.namespace, model.name, model.generation or 0)
            )
        self._identities_seeded = True

    async def _converge(self, entries: Sequence[DesiredEntry]) -> list[EntryResult]:
        await self._seed_identities()
        decided: dict[str, EntryResult] = {}
        for entry in entries:
            result = self._check_identity(entry)
            if result is not None:
                decided[entry.uid] = result
        passed = [e for e in entries if e.uid not in decided]
        answers = list(await self.backend.converge(passed)) if passed else []
        if [a.uid for a in answers] != [e.uid for e in passed]:
            raise BackendError("converge must answer every entry it was given, in order")
        for entry, answer in zip(passed, answers, strict=True):
            decided[entry.uid] = answer
            if answer.outcome in ("applied", "deferred"):
                self._identities[entry.uid] = _Identity(
                    entry.namespace, entry.name, entry.generation
                )
            logger.debug("entry %s: %s (%s)", entry.uid, answer.outcome, answer.reason)
        return [decided[e.uid] for e in entries]

    def _check_identity(self, entry: DesiredEntry) -> EntryResult | None:
        known = self._identities.get(entry.uid)
        if known is None:
            return None
        if (known.namespace, known.name) != (entry.namespace, entry.name):
            return EntryResult(
                uid=entry.uid,
                outcome="conflict",
                reason="IdentityChanged",
                message=(
                    f"uid {entry.uid} is {known.namespace}/{known.name} here, "
                    f"not {entry.namespace}/{entry.name}"
                ),
            )
        if entry.generation < known.generation:
            return EntryResult(
                uid=entry.uid,
                outcome="stale",
                reason="OlderGeneration",
                message=f"generation {entry.generation} is older than {known.generation}",
            )
        return None

    def _pending_unloads(self, now: float) -> tuple[PendingUnload, ...]:
        return tuple(
            PendingUnload(uid=uid, unload_in_seconds=max(deadline - now, 0.0))
            for uid, deadline in sorted(self._schedule.deadlines.items())
        )

    async def unload_due(self) -> tuple[str, ...]:
        """Unload every model whose grace period has run out; the uids unloaded.

        The lock is taken per model, not for the whole batch: a set shrinking from
        thousands of entries unloads thousands of models, and PUT and DELETE go on being
        answered between them (a model a PUT brought back or a DELETE forgot meanwhile is
        skipped). The desired entries are saved once for the batch, written after the lock
        is released."""
        done: list[str] = []
        for uid in self._schedule.due(self._clock()):
            async with self._lock:
                deadline = self._schedule.deadlines.get(uid)
                if deadline is None or deadline > self._clock():
                    continue  # back in the set, or deleted, while earlier ones unloaded
                try:
                    await self.backend.unload(uid)
                except Exception:
                    logger.exception("unloading %s failed; retrying on the next check", uid)
                    continue
                self._schedule = self._schedule.without(uid)
                self._unloaded.add(uid)
                done.append(uid)
                logger.info("unloaded %s: missing from the desired set past its grace", uid)
        if done:
            async with self._lock:
                saved = self.backend.save_desired()
            await _saved(saved)
        return tuple(done)

    async def delete(self, uid: str) -> ActionResult:
        """Forget a model the set no longer holds, host-store bytes included."""
        async with self._lock:
            if await self._is_desired(uid):
                raise RefusedError(
                    "StillDesired", f"{uid} is in the desired set; remove it from the set first"
                )
            held = await self.backend.forget(uid)
            self._schedule = self._schedule.without(uid)
            self._unloaded.discard(uid)
            self._identities.pop(uid, None)
            # Saved even when nothing was held: a retried DELETE whose first save failed
            # must still take the uid off the saved set (else a restart brings it back).
            saved = self.backend.save_desired()
        await _saved(saved)
        if not held:
            return ActionResult(uid=uid, outcome="unchanged", reason="NotHeld")
        logger.info("forgot %s and its host-store bytes", uid)
        return ActionResult(uid=uid, outcome="completed", reason="Forgotten")

    async def _is_desired(self, uid: str) -> bool:
        if self._pushed:
            return uid in self._desired
        return any(m.uid == uid and m.desired for m in await self.backend.models())

    # --- fencing ---------------------------------------------------------------------------

    def record_lease_renewal(self) -> None:
        """The heartbeat renewed this node's Lease."""
        self._fencing = self._fencing.lease_renewed(self._clock())

    def may_load_new(self) -> bool:
        """False while fenced: resident models keep serving, nothing new is loaded."""
        return self._fencing.may_load_new(self._clock())

    # --- reads and manual swaps ------------------------------------------------------------

    async def node_info(self) -> NodeInfo:
        info = await self.backend.node_info()
        return dataclasses.replace(info, revision=self._revision, fenced=not self.may_load_new())

    async def models(self) -> tuple[ModelInfo, ...]:
        now = self._clock()
        return tuple(
            dataclasses.replace(
                model,
                desired=model.uid in self._desired if self._pushed else model.desired,
                unload_in_seconds=self._schedule.remaining_seconds(model.uid, now),
            )
            for model in sorted(await self.backend.models(), key=lambda m: m.uid)
        )

    async def model(self, uid: str) -> ModelInfo:
        for model in await self.models():
            if model.uid == uid:
                return model
        raise UnknownModelError(uid)

    async def swap_in(self, uid: str) -> ActionResult:
        if not self.may_load_new():
            raise RefusedError(
                "Fenced",
                "Lease renewals and operator pushes have both failed for the grace period; "
                "nothing new is loaded",
            )
        return await self.backend.swap_in(uid)

    async def swap_out(self, uid: str) -> ActionResult:
        return await self.backend.swap_out(uid)

    async def reload(self, uid: str, *, keep_host_copy: bool) -> ActionResult:
        if not self.may_load_new():
            raise RefusedError(
                "Fenced",
                "Lease renewals and operator pushes have both failed for the grace period; "
                "nothing new is loaded",
            )
        return await self.backend.reload(uid, keep_host_copy=keep_host_copy)


async def _saved(saved: asyncio.Future[None]) -> None:
    """Wait, outside the control lock, for a snapshot to be saved. Shielded: a client that
    goes away cancels only its wait; the write goes on, and its outcome is still logged."""
    await asyncio.shield(saved)
