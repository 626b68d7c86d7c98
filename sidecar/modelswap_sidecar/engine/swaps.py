"""Swap-out and swap-in of one model across all its live instances, with rollback.

Swap-out: DRAINING (every instance drains its `in_use()` work and synchronizes; when
that takes longer than `drain_timeout_seconds`, the drain's overdue listener, the agent's
gateway, ends the model's requests, and the drain waits `drain_end_grace_seconds` more
for them to leave) → QUIESCED → SAVING (preserved KV to the host store, committed
before anything is unmapped) → UNMAPPED (clients unmapped and dropped their handles) →
chunks released → SWAPPED_OUT.
A failure before UNMAP resumes every client and returns to RESIDENT. A model committing
its weights is never swapped out (`Committing`): refused before the drain when a commit
waits for the lock, rolled back after it when one came in during the drain (such a commit
runs beside the drain, whose end it would otherwise wait for: `Attacher.commit`).

Swap-in: ALLOCATING (make room by swapping out the victims the caller chose, nobody
else; create chunks) → MAPPED (clients map them at their
reserved addresses) → RESTORING (clients copy the host copies in) → RESIDENT. A failure
anywhere unmaps what was mapped, releases what was created, and returns to SWAPPED_OUT.

Removal (DELETING) tears a model down the same way for good. Callers hold the model's
operation lock (and, for swap-in, the GPU's allocation lock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from modelswap_api.wire import KvMode, Op, RegionKind, RemoteError, SwapOutMode
from modelswap_sidecar.allocators.base import Chunk
from modelswap_sidecar.engine.errors import (
    ClientFailed,
    Committing,
    EngineError,
    ModelFailed,
    NoCapacity,
    UnknownModel,
    WrongState,
)
from modelswap_sidecar.engine.events import MAKE_ROOM, SwapEvent, SwapEvents, SwapKind
from modelswap_sidecar.engine.hoststore import HostStore, Staging
from modelswap_sidecar.engine.ledger import GpuLedger
from modelswap_sidecar.engine.records import (
    CopyReport,
    InstanceRecord,
    ModelRecord,
    RegionRecord,
)
from modelswap_sidecar.engine.settings import EngineSettings
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.table import ModelTable
from modelswap_sidecar.engine.transport import Transport, broadcast, close_fd, send

log = logging.getLogger(__name__)
S = EngineState


def awaiting_reload(m: ModelRecord) -> bool:
    """LOADING with every live instance mapped: a dropped (or failed) model swapped in,
    fresh memory mapped, its weights loaded from the source by the runtime's next request
    and committed then. Nothing is committed yet, so a swap-out drops it and loses nothing."""
    live = m.live_instances()
    return m.state is S.LOADING and bool(live) and all(i.mapped for i in live)


#: Told the engine name of a model whose swap-out's drain passed `drain_timeout_seconds`
#: (on a timer thread; it must not block): it should end the work holding the drain.
DrainOverdueListener = Callable[[str], None]


class HostCopyLost(Exception):  # noqa: N818 - reads as the condition
    """A committed host copy cannot be opened: unrecoverable for this model (→ FAILED)."""


class Swapper:
    """Swap operations on the model table's records, through the ledger (budgets, chunks),
    the transport (the clients) and the host store."""

    def __init__(
        self,
        *,
        table: ModelTable,
        ledger: GpuLedger,
        transport: Transport,
        store: HostStore,
        settings: EngineSettings,
        events: SwapEvents,
        checkpoint: Callable[[str], None],
    ) -> None:
        self.table = table
        self.ledger = ledger
        self.transport = transport
        self.store = store
        self.settings = settings
        self.events = events
        self.checkpoint = checkpoint
        #: `Engine.on_drain_overdue`'s listener; None: a drain past its timeout rolls back
        self.drain_overdue: DrainOverdueListener | None = None

    def _broadcast(
        self,
        m: ModelRecord,
        instances: list[InstanceRecord],
        op: Op,
        *,
        bodies: dict[str, dict[str, Any]] | None = None,
        fds: dict[str, list[int]] | None = None,
        timeout_seconds: float | None = None,
    ) -> tuple[list[InstanceRecord], list[tuple[InstanceRecord, str]]]:
        """Send `op` to every instance at once and wait for all replies: (instances that
        succeeded, (instance, why) that failed)."""
        replies = broadcast(
            self.transport,
            m.epoch,
            instances,
            op,
            timeout_seconds or self.settings.client_timeout_seconds,
            bodies=bodies,
            fds=fds,
        )
        return replies.succeeded, replies.failed

    # -- room ----------------------------------------------------------------------------

    def make_room(self, m: ModelRecord, need_bytes: int, victims: Sequence[str]) -> None:
        """Swap out `victims` (the caller's choice, in its order; resident ones on the same
        GPU) until `need_bytes` fit, or raise NoCapacity. The engine chooses nobody."""
        view = self.ledger.view(m.config.gpu)
        if need_bytes > view.budget_bytes:
            raise NoCapacity(
                f"model {m.name} needs {need_bytes} bytes; GPU {m.config.gpu}'s whole budget "
                f"is {view.budget_bytes}"
            )
        for name in victims:
            if need_bytes <= self.ledger.view(m.config.gpu).available_bytes:
                return
            try:
                v = self.table.get(name)
            except UnknownModel:
                continue
            if v is m or v.config.gpu != m.config.gpu:
                continue
            with v.lock:
                if v.state is S.RESIDENT or awaiting_reload(v):
                    try:
                        self.swap_out_locked(v, reason=f"making room for {m.name}", cause=MAKE_ROOM)
                    except (ClientFailed, Committing) as ex:
                        log.info("victim %s could not be swapped out: %s", v.name, ex)
        available = self.ledger.view(m.config.gpu).available_bytes
        if need_bytes > available:
            raise NoCapacity(
                f"model {m.name} needs {need_bytes} bytes on GPU {m.config.gpu}; "
                f"{available} available after the {len(victims)} victim(s) it was given"
            )

    # -- swap-out ------------------------------------------------------------------------

    def swap_out_locked(self, m: ModelRecord, reason: str = "", cause: str = "") -> None:
        """`cause`: the swap-out's cause in its `SwapEvent` (default: `reason`)."""
        if m.state is S.SWAPPED_OUT:
            return
        reloading = awaiting_reload(m)
        if m.state is not S.RESIDENT and not reloading:
            raise WrongState(f"model {m.name} is {m.state}, not Resident")
        before = m.state
        started = time.perf_counter()
        live = [i for i in m.live_instances() if i.mapped]
        with self.table.lock:  # against `Attacher.commit`, which counts itself under it
            if m.commits:
                # its committer is inside in_use(), waiting for the lock this caller holds:
                # the drain would wait for it in turn, until the drain timed out
                raise Committing(
                    f"model {m.name} is committing its weights (loaded for requests in "
                    "flight): not swapped out"
                )
            m.epoch += 1
            self.table.set_state(m, S.DRAINING, reason or "swap-out requested")
            m.draining, m.commit_joined_drain = True, False
        # a model mapped afresh and not committed yet holds nothing worth keeping: dropped
        drop = m.config.on_swap_out is SwapOutMode.DROP or reloading
        # a dropped model is reloaded from its source: its KV is never worth saving
        kv_mode = KvMode.DISCARD if drop else m.config.kv_mode
        stagings: list[tuple[RegionRecord, Staging]] = []
        try:
            try:
                live, failed = self._quiesce(m, live)
            finally:
                gave_way = self._end_drain(m)
            self._drop_gone(m, failed)
            if failed:
                raise ClientFailed("; ".join(why for _, why in failed))
            if gave_way:  # the model was loading its weights: not a victim
                raise Committing(
                    f"model {m.name} committed its weights during the swap-out's drain (they "
                    "were loaded for requests in flight): swap-out rolled back"
                )
            self.table.set_state(m, S.QUIESCED)
            self.checkpoint("swap_out.quiesced")
            kv_regions = [
                (i, r) for i in live for r in i.regions.values() if r.kind is RegionKind.KV
            ]
            if kv_mode is KvMode.PRESERVE and kv_regions:
                self.table.set_state(m, S.SAVING)
                bodies: dict[str, dict[str, Any]] = {}
                fds: dict[str, list[int]] = {}
                for inst, r in kv_regions:
                    relpath = self.store.relpath(m.config.gpu, m.name, inst.name, r.tag, "kv")
                    st = self.store.stage(m.config.gpu, relpath, r.size_bytes)
                    stagings.append((r, st))
                    lst = fds.setdefault(inst.name, [])
                    bodies.setdefault(inst.name, {"regions": []})["regions"].append(
                        {"tag": r.tag, "fd": len(lst), "bytes": r.size_bytes}
                    )
                    lst.append(st.fd)
                _ok, failed = self._broadcast(m, live, Op.SAVE, bodies=bodies, fds=fds)
                self._drop_gone(m, failed)
                if failed:
                    raise ClientFailed("; ".join(why for _, why in failed))
                self.checkpoint("swap_out.kv_saved")
                for r, st in stagings:
                    old = r.kv_file
                    r.kv_file = self.store.commit(st)
                    if old is not None and old.relpath != r.kv_file.relpath:
                        self.store.delete(old)
                stagings = []
                self.table.persist()  # the state file names the KV copies only once they are whole
        except BaseException as ex:
            for _r, st in stagings:
                self.store.abort(st)
            self._broadcast(
                m,
                m.live_instances(),
                Op.RESUME,
                bodies={i.name: {"state": "resident"} for i in m.instances.values()},
            )
            with self.table.lock:
                back, still = before, m.live_instances()
                if before is S.LOADING and still and all(i.committed for i in still):
                    back = S.RESIDENT  # a commit that ran beside the drain loaded it
                self.table.set_state(m, back, f"swap-out rolled back: {ex}")
            if isinstance(ex, ClientFailed | RemoteError | OSError):
                raise ClientFailed(f"swap-out of {m.name} rolled back: {ex}") from ex
            raise
        discarded = kv_mode is KvMode.DISCARD and any(
            r.kind is RegionKind.KV for i in live for r in i.regions.values()
        )
        body = {"kv_discarded": discarded, "dropped": drop}
        ok, failed = self._broadcast(m, live, Op.UNMAP, bodies={i.name: body for i in live})
        self.table.set_state(m, S.UNMAPPED)
        self.checkpoint("swap_out.unmapped")
        for inst in ok:
            self.ledger.release_instance(m.config.gpu, inst)
        for inst, why in failed:  # a client that cannot unmap is cut off, its chunks released
            log.warning("model %s: %s; disconnecting it", m.name, why)
            self.transport.disconnect(inst)
            self.ledger.release_instance(m.config.gpu, inst)
        m.kv_discarded = discarded
        m.swap_outs += 1
        m.last_swap_out_seconds = time.perf_counter() - started
        if drop:
            self.discard_host_copies(m)
            self.table.set_state(m, S.DROPPED, reason or "dropped (onSwapOut: drop)")
        else:
            self.table.set_state(m, S.SWAPPED_OUT, reason or "swapped out")
        self.events.emit(
            SwapEvent(
                model=m.name,
                kind=SwapKind.OUT,
                seconds=m.last_swap_out_seconds,
                cause=cause or reason,
                dropped=drop,
            )
        )

    def _quiesce(
        self, m: ModelRecord, live: list[InstanceRecord]
    ) -> tuple[list[InstanceRecord], list[tuple[InstanceRecord, str]]]:
        """QUIESCE every instance: each answers once its `in_use()` work has left. Past
        `drain_timeout_seconds` the overdue listener (if any) is told to end that work
        (the gateway cancels the model's requests at Triton, whose models stop at their
        next `is_cancelled()` check), and the drain waits `drain_end_grace_seconds` more
        before it fails (the swap-out then rolls back)."""
        settings = self.settings
        listener = self.drain_overdue
        if listener is None:
            return self._broadcast(
                m, live, Op.QUIESCE, timeout_seconds=settings.drain_timeout_seconds
            )
        drained = threading.Event()

        def overdue() -> None:
            if drained.is_set():
                return
            log.warning(
                "model %s: its swap-out's drain passed %gs (drainTimeoutSeconds); ending the "
                "requests that hold it",
                m.name,
                settings.drain_timeout_seconds,
            )
            self.checkpoint("swap_out.drain_overdue")
            try:
                listener(m.name)
            except Exception:
                log.exception("model %s: the drain's overdue listener failed", m.name)

        timer = threading.Timer(settings.drain_timeout_seconds, overdue)
        timer.daemon = True
        timer.start()
        try:
            return self._broadcast(
                m,
                live,
                Op.QUIESCE,
                timeout_seconds=settings.drain_timeout_seconds + settings.drain_end_grace_seconds,
            )
        finally:
            drained.set()
            timer.cancel()

    def _end_drain(self, m: ModelRecord) -> bool:
        """Wait until every commit that came in during the drain has ended (each is bounded
        by its own client round trip), so nothing of the swap-out goes on beside one; from
        then on a commit waits for the operation lock. Whether one came in."""
        with self.table.commits_done:
            self.table.commits_done.wait_for(lambda: m.joined_commits == 0)
            m.draining = False
            return m.commit_joined_drain

    def _drop_gone(self, m: ModelRecord, failed: list[tuple[InstanceRecord, str]]) -> None:
        """Instances whose process died mid-operation leave it; the rest decide the outcome.
        A gone instance's chunks are released now, as its socket's `client_gone` would
        (which waits for this operation's lock), so a swap-in making room counts them
        free (issue 26, item 6: a frozen victim ended by the agent)."""
        for inst, _ in list(failed):
            if not inst.live:
                failed.remove((inst, _))
                if inst.mapped:
                    self.ledger.release_instance(m.config.gpu, inst)

    # -- swap-in -------------------------------------------------------------------------

    def swap_in_locked(self, m: ModelRecord, victims: Sequence[str] = ()) -> None:
        if m.state is S.RESIDENT or (
            m.state is S.LOADING and all(i.mapped for i in m.live_instances())
        ):
            return
        if m.state in (S.DROPPED, S.FAILED):  # a swap-in too: fresh memory mapped again
            started = time.perf_counter()
            self.reload_locked(m, victims)
            m.swap_ins += 1
            seconds = time.perf_counter() - started
            self.events.emit(SwapEvent(model=m.name, kind=SwapKind.IN, seconds=seconds))
            return
        if m.state is not S.SWAPPED_OUT:
            raise WrongState(f"model {m.name} is {m.state}, not SwappedOut")
        live = m.live_instances()
        if not live:
            raise WrongState(f"model {m.name} has no connected instance to swap into")
        started = time.perf_counter()
        m.epoch += 1
        # not persisted: until the restore the state file keeps SWAPPED_OUT, which is what a
        # restarted agent finds anyway (clients roll a half-done swap-in back, then readopt)
        self.table.set_state(m, S.ALLOCATING, "swap-in requested", persist=False)
        try:
            replies = self.bring_in(m, live, track_states=True, victims=victims)
        except (EngineError, RemoteError) as ex:  # rolled back; the host copy is intact
            self.table.set_state(m, S.SWAPPED_OUT, f"swap-in failed: {ex}")
            raise
        except Exception as ex:  # rolled back, but nothing says a retry could work
            self.fail(m, f"swap-in failed: {ex!r}")
            raise ModelFailed(f"model {m.name} failed: {m.reason}") from ex
        m.swap_ins += 1
        m.last_swap_in_seconds = time.perf_counter() - started
        m.last_swap_in_copy = CopyReport.from_replies(list(replies.values()))
        m.last_used = time.monotonic()
        # not persisted: the state file was written during the restore with the instances
        # mapped, which is all a restarted agent needs (it resolves RESIDENT from readopt);
        # the next write records RESIDENT and the swap-in count
        self.table.set_state(m, S.RESIDENT, "swapped in", persist=False)
        self.events.emit(SwapEvent(model=m.name, kind=SwapKind.IN, seconds=m.last_swap_in_seconds))

    def reload_locked(self, m: ModelRecord, victims: Sequence[str] = ()) -> None:
        """DROPPED/FAILED → LOADING: fresh chunks at the old addresses; the runtime loads
        the weights from the source again and commits (a swap-in never sees a host copy).
        A reload that fails (no room: NoCapacity; a client refusing its map) has undone what
        it mapped (`bring_in`) and leaves the model as it was, DROPPED or FAILED, so a
        later swap-in tries again; LOADING would claim memory it does not hold."""
        live = m.live_instances()
        if not live:
            raise WrongState(f"model {m.name} has no connected instance to reload into")
        before = m.state
        m.epoch += 1
        self.table.set_state(m, S.LOADING, f"reloading from the source after {before}")
        try:
            self.bring_in(m, live, track_states=False, victims=victims)
        except BaseException as ex:
            self.table.set_state(m, before, f"reload from the source failed: {ex}")
            raise
        m.last_used = time.monotonic()
        self.table.persist()

    def discard_host_copies(self, m: ModelRecord) -> None:
        """Delete every host-store copy of the model (drop, failure, removal)."""
        for inst in m.instances.values():
            for r in inst.regions.values():
                for f in (r.weights_file, r.kv_file):
                    if f is not None:
                        self.store.delete(f)
                r.weights_file = r.kv_file = None
            inst.committed = False

    def remove_locked(self, m: ModelRecord) -> None:
        """DELETING: every client is told (it unmaps and detaches for good), every chunk is
        released, every host-store copy deleted, and the model forgotten."""
        gpu = m.config.gpu
        if m.state is not S.DELETING:
            self.table.set_state(m, S.DELETING, "removed")
        live = m.live_instances()
        _ok, failed = self._broadcast(m, live, Op.REMOVED)
        for _inst, why in failed:
            log.warning("model %s: %s; disconnecting it", m.name, why)
        for inst in m.instances.values():
            if inst.mapped:
                self.ledger.release_instance(gpu, inst)
        self.discard_host_copies(m)
        for inst in m.instances.values():  # its clients unmapped their KV host tiers
            if inst.kv_host_file is not None:
                self.store.delete(inst.kv_host_file)
                inst.kv_host_file = None
        with self.table.lock:
            gone = list(m.instances.values())
            for inst in gone:
                if inst.peer is not None:
                    self.ledger.process_detached(gpu, inst.pid, gone)
            self.table.forget(m)
        for inst in live:
            self.transport.disconnect(inst)

    def fail(self, m: ModelRecord, reason: str) -> None:
        """FAILED: every client unmapped (those that cannot are cut off), every chunk
        released, the host copies deleted; the reason stays in the status."""
        mapped = [i for i in m.instances.values() if i.mapped]
        # every live client, mapped or not, hears it: it also drops its mappings of the
        # host copies (kept between swap-ins), which are deleted below
        live = m.live_instances()
        if live:
            body = {"kv_discarded": True, "dropped": True}
            _ok, failed = self._broadcast(m, live, Op.UNMAP, bodies={i.name: body for i in live})
            for inst, why in failed:
                log.warning("model %s: %s; disconnecting it", m.name, why)
                self.transport.disconnect(inst)
        for inst in mapped:
            self.ledger.release_instance(m.config.gpu, inst)
        self.discard_host_copies(m)
        log.error("model %s failed: %s", m.name, reason)
        self.table.set_state(m, S.FAILED, reason)

    def bring_in(
        self,
        m: ModelRecord,
        instances: list[InstanceRecord],
        *,
        track_states: bool,
        victims: Sequence[str] = (),
    ) -> dict[str, dict[str, Any]]:
        """Allocate, map and restore `instances` (after swapping out as many of `victims` as
        it takes); returns each instance's restore reply body."""
        gpu = m.config.gpu
        need = sum(r.size_bytes for i in instances for r in i.regions.values())
        self.make_room(m, need, victims)
        made: dict[int, list[Chunk]] = {}
        mapped: list[InstanceRecord] = []
        try:
            bodies: dict[str, dict[str, Any]] = {}
            fds: dict[str, list[int]] = {}
            for inst in instances:
                lst = fds.setdefault(inst.name, [])
                regions_doc = []
                for r in inst.regions.values():
                    chunks = self.ledger.allocate(gpu, r.size_bytes)
                    made[id(r)] = chunks
                    offset = 0
                    chunk_docs = []
                    for c in chunks:
                        chunk_docs.append({"offset": offset, "bytes": c.size_bytes, "fd": len(lst)})
                        lst.append(self.ledger.export_fd(c))
                        offset += c.size_bytes
                    regions_doc.append({"tag": r.tag, "chunks": chunk_docs})
                bodies[inst.name] = {"regions": regions_doc}
            self.checkpoint("swap_in.allocated" if track_states else "attach.allocated")
            try:
                ok, failed = self._broadcast(m, instances, Op.MAP, bodies=bodies, fds=fds)
            finally:
                for lst in fds.values():
                    for fd in lst:
                        close_fd(fd)
            for inst in ok:
                for r in inst.regions.values():
                    r.chunks = made.pop(id(r))
                inst.mapped = True
                mapped.append(inst)
            if failed:
                raise ClientFailed("; ".join(why for _, why in failed))
            self.checkpoint("swap_in.mapped" if track_states else "attach.mapped")
            if track_states:  # mid-swap-in states, not persisted either
                self.table.set_state(m, S.MAPPED, persist=False)
                self.table.set_state(m, S.RESTORING, persist=False)
            results = self._restore(m, instances, persist_while_copying=track_states)
        except BaseException:
            for lst2 in made.values():
                self.ledger.release(gpu, lst2)
            if mapped:
                self._broadcast(
                    m, mapped, Op.UNMAP, bodies={i.name: {"rollback": True} for i in mapped}
                )
                for inst in mapped:
                    self.ledger.release_instance(gpu, inst)
            raise
        stale = False
        for inst in instances:  # HBM holds the newest KV now; the saved copy is stale
            for r in inst.regions.values():
                if r.kv_file is not None:
                    self.store.delete(r.kv_file)
                    r.kv_file = None
                    stale = True
        if stale and track_states:  # the file written during the restore names it
            self.table.persist()
        return results

    def _restore(
        self, m: ModelRecord, instances: list[InstanceRecord], *, persist_while_copying: bool
    ) -> dict[str, dict[str, Any]]:
        """Send `restore` to every instance and wait for them to copy. With
        `persist_while_copying`, the state file (instances mapped, RESTORING) is written
        while the clients copy, so the swap-in's only state-file write costs it nothing."""
        bodies: dict[str, dict[str, Any]] = {}
        fds: dict[str, list[int]] = {}
        for inst in instances:
            lst = fds.setdefault(inst.name, [])
            docs = []
            for r in inst.regions.values():
                source = None
                if r.kind is RegionKind.WEIGHTS and r.weights_file is not None:
                    source = r.weights_file
                elif (
                    r.kind is RegionKind.KV
                    and r.kv_file is not None
                    and m.config.kv_mode is KvMode.PRESERVE
                ):
                    source = r.kv_file
                if source is None:
                    docs.append({"tag": r.tag, "fresh": True})
                else:
                    try:
                        fd = self.store.open_readonly(source)
                    except OSError as ex:  # the only complete copy is gone
                        for opened in fds.values():
                            for x in opened:
                                close_fd(x)
                        raise HostCopyLost(
                            f"host copy {source.relpath} of region {r.tag} is gone: {ex}"
                        ) from ex
                    docs.append({"tag": r.tag, "fd": len(lst), "bytes": r.size_bytes})
                    lst.append(fd)
            bodies[inst.name] = {"regions": docs}
        try:
            batch = send(
                self.transport,
                m.epoch,
                instances,
                Op.RESTORE,
                bodies=bodies,
                fds=fds,
                stop_at_failure=True,
            )
        finally:
            for lst in fds.values():
                for fd in lst:
                    close_fd(fd)
        if batch.failed:
            raise ClientFailed("; ".join(why for _, why in batch.failed))
        if persist_while_copying:
            # crash-safe: a restarted agent that finds instances marked mapped waits for
            # them to readopt and settles the model from what they hold (a client whose
            # restore did not finish unmaps first and comes back swapped out)
            self.table.persist()
        replies = batch.wait(self.settings.client_timeout_seconds, stop_at_failure=True)
        if replies.failed:
            raise ClientFailed(f"restore on {replies.why()}")
        return {inst.name: body for inst, body in replies.ok}
