"""The engine: the registry of models, the client-facing handlers, and recovery.

Thread model: each model has an operation lock held for a whole operation (swap-in,
swap-out, attach, commit, readopt); each GPU has an allocation lock held by swap-ins so two
swap-ins on one GPU never evict each other; `_mut` guards records for short mutations and
the state file. Client round trips never hold `_mut`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modelswap_api.wire import (
    ErrorCode,
    Message,
    Op,
    Peer,
    RegionKind,
    RemoteError,
    error_reply,
    reply_to,
)
from modelswap_sidecar.allocators.base import GRANULARITY_BYTES, Allocator, Location
from modelswap_sidecar.engine.budget import BudgetView, HbmBudget
from modelswap_sidecar.engine.errors import (
    EngineError,
    NotVouched,
    ProtocolViolation,
    UnknownModel,
    WrongState,
)
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import (
    CopyReport,
    InstanceRecord,
    ModelConfig,
    ModelRecord,
    RegionRecord,
    from_doc,
    to_doc,
)
from modelswap_sidecar.engine.states import PHASES, EngineState, check_transition
from modelswap_sidecar.engine.swaps import Swapper
from modelswap_sidecar.engine.vouching import Voucher

log = logging.getLogger(__name__)
S = EngineState

#: Where the engine calls `checkpoint`: after each step that leaves something for a crash
#: to find (a fault test kills the agent there).
CHECKPOINTS = (
    "commit.saved",  # the client wrote the weights into staging files; nothing renamed
    "commit.renamed",  # weight files in place; the state file does not name them yet
    "swap_out.quiesced",  # every instance drained; nothing saved or unmapped
    "swap_out.kv_saved",  # preserved KV written into staging files; nothing renamed
    "swap_out.unmapped",  # every client unmapped; chunks not yet released
    "swap_in.allocated",  # chunks created and exported; nothing sent to clients
    "swap_in.mapped",  # clients mapped the chunks; nothing restored
    "attach.allocated",  # the same two steps when a client attaches to a resident model
    "attach.mapped",
)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    client_timeout_seconds: float = 60.0  # one client round trip (map, restore, save, unmap)
    drain_timeout_seconds: float = 60.0  # quiesce: how long in_use() work may hold a swap-out
    readopt_grace_seconds: float = 10.0  # after a restart, how long clients have to readopt
    reserve_bytes: dict[int, int] = field(default_factory=dict)  # per GPU
    #: the estimate per runtime process, used when the allocator measures nothing
    overhead_bytes_per_process: int = 0
    #: a client silent for this long is logged (nothing else happens: the socket is the
    #: liveness signal)
    heartbeat_timeout_seconds: float = 30.0


@dataclass(frozen=True, slots=True)
class ModelStatus:
    name: str
    gpu: int
    state: EngineState
    phase: str
    epoch: int
    resident_bytes: int
    instances: int
    swap_ins: int
    swap_outs: int
    last_swap_in_seconds: float
    kv_discarded: bool
    reason: str
    #: live instance → seconds since its last heartbeat (None: none received yet)
    last_heartbeat_ages_seconds: dict[str, float | None] = field(default_factory=dict)
    #: what the last swap-in copied and how fast; `scaled` when paced (sim emulation)
    last_swap_in_copy: CopyReport = field(default_factory=CopyReport)


def _no_checkpoint(name: str) -> None:
    """The default `checkpoint`: nothing."""


class Engine:
    """`checkpoint(name)` is called at named points inside operations (see CHECKPOINTS);
    fault tests pass one that pauses there, so an agent can be killed exactly mid-operation.
    """

    def __init__(
        self,
        allocator: Allocator,
        store: HostStore,
        voucher: Voucher,
        settings: EngineSettings | None = None,
        checkpoint: Callable[[str], None] = _no_checkpoint,
    ) -> None:
        self.allocator = allocator
        self.store = store
        self.voucher = voucher
        self.settings = settings or EngineSettings()
        self.checkpoint = checkpoint
        self.budgets: dict[int, HbmBudget] = {}
        for loc in allocator.locations():
            info = allocator.memory_info(loc)
            self.budgets[loc.index] = HbmBudget(
                loc.index,
                info.total_bytes,
                self.settings.reserve_bytes.get(loc.index, 0),
                self.settings.overhead_bytes_per_process,
            )
        self._models: dict[str, ModelRecord] = {}
        self._peers: dict[int, tuple[str, str]] = {}  # id(peer) → (model, instance)
        self._mut = threading.RLock()
        self._gpu_locks = {g: threading.Lock() for g in self.budgets}
        self._recovered = threading.Event()
        self._recovered.set()
        self._recovery_waiters = 0
        self.swapper = Swapper(self)
        self._stop = threading.Event()
        self._monitor = threading.Thread(
            target=self._watch_heartbeats, name="engine-heartbeats", daemon=True
        )
        self._monitor.start()

    # -- registry ------------------------------------------------------------------------

    def add_model(self, config: ModelConfig) -> None:
        if config.gpu not in self.budgets:
            raise UnknownModel(f"model {config.name}: no GPU {config.gpu} on this node")
        with self._mut:
            m = self._models.get(config.name)
            if m is None:
                self._models[config.name] = ModelRecord(config)
            else:
                if m.config.gpu != config.gpu:
                    raise WrongState(f"model {config.name} lives on GPU {m.config.gpu}")
                m.config = config
            self.persist()

    def model(self, name: str) -> ModelRecord:
        with self._mut:
            m = self._models.get(name)
        if m is None:
            raise UnknownModel(f"no model {name!r}")
        return m

    def models_on_gpu(self, gpu: int) -> list[ModelRecord]:
        with self._mut:
            return [m for m in self._models.values() if m.config.gpu == gpu]

    def set_state(
        self, m: ModelRecord, state: EngineState, reason: str = "", *, persist: bool = True
    ) -> None:
        """Move `m` to `state`; `persist=False` for transient steps whose state file entry
        recovery would never use (it rebuilds them from what clients readopt)."""
        with self._mut:
            check_transition(m.state, state)
            log.debug("model %s: %s → %s (%s)", m.name, m.state, state, reason)
            m.state = state
            if reason:
                m.reason = reason
            if persist:
                self.persist()

    def persist(self) -> None:
        with self._mut:
            self.store.write_state(to_doc(self._models))

    def close_fd(self, fd: int) -> None:
        try:
            os.close(fd)
        except OSError:
            log.warning("closing fd %d failed", fd)

    # -- status --------------------------------------------------------------------------

    def status(self, name: str) -> ModelStatus:
        m = self.model(name)
        now = time.monotonic()
        with self._mut:
            return ModelStatus(
                m.name,
                m.config.gpu,
                m.state,
                PHASES[m.state].phase,
                m.epoch,
                m.chunk_bytes(),
                len(m.live_instances()),
                m.swap_ins,
                m.swap_outs,
                m.last_swap_in_seconds,
                m.kv_discarded,
                m.reason,
                {
                    i.name: None if i.last_heartbeat is None else now - i.last_heartbeat
                    for i in m.live_instances()
                },
                m.last_swap_in_copy,
            )

    def statuses(self) -> list[ModelStatus]:
        with self._mut:
            names = list(self._models)
        return [self.status(n) for n in names]

    def budget(self, gpu: int) -> BudgetView:
        return self.budgets[gpu].view()

    # -- operations (control API) ----------------------------------------------------------

    def swap_out(self, name: str, reason: str = "") -> None:
        m = self.model(name)
        # right after a restart the engine does not know yet which instances map chunks
        # (they come back through readopt): a swap-out now would unmap nothing and report
        # success while the clients, once readopted, still hold the memory
        self._wait_recovered()
        with m.lock:
            self.swapper.swap_out_locked(m, reason)

    def swap_in(self, name: str) -> None:
        m = self.model(name)
        self._wait_recovered()
        with self._gpu_locks[m.config.gpu], m.lock:
            self.swapper.swap_in_locked(m)

    def remove_model(self, name: str) -> None:
        """DELETING: every client is told (it unmaps and detaches for good), every chunk is
        released, every host-store copy deleted, and the model forgotten."""
        m = self.model(name)
        with m.lock:
            if m.state is not S.DELETING:
                self.set_state(m, S.DELETING, "removed")
            live = m.live_instances()
            _ok, failed = self.swapper.broadcast(m, live, Op.REMOVED)
            for _inst, why in failed:
                log.warning("model %s: %s; disconnecting it", m.name, why)
            for inst in m.instances.values():
                if inst.mapped:
                    self.swapper.release_instance(m, inst)
            self.swapper.discard_host_copies(m)
            for inst in m.instances.values():  # its clients unmapped their KV host tiers
                if inst.kv_host_file is not None:
                    self.store.delete(inst.kv_host_file)
                    inst.kv_host_file = None
            with self._mut:
                for inst in m.instances.values():
                    if inst.peer is not None:
                        self._peers.pop(id(inst.peer), None)
                gone = list(m.instances.values())
                for inst in gone:
                    if inst.peer is not None:
                        self._detach_process(m.config.gpu, inst.pid, gone)
                del self._models[m.name]
                self.persist()
            for inst in live:
                if inst.peer is not None:
                    inst.peer.close()
        log.info("model %s removed", name)

    def touch(self, name: str) -> None:
        self.model(name).last_used = time.monotonic()

    # -- client protocol -------------------------------------------------------------------

    def handle(self, peer: Peer, message: Message) -> Message | None:
        """Serve one client request (runs on its own thread)."""
        try:
            if message.op is Op.REGISTER:
                return self._register(peer, message)
            binding = self._peers.get(id(peer))
            if binding is None:
                raise NotVouched("register first")
            m = self.model(binding[0])
            inst = m.instances[binding[1]]
            if message.op is Op.HEARTBEAT:
                return self._heartbeat(m, inst, message)
            if message.op is Op.ATTACH:
                return self._attach(m, inst, message)
            if message.op is Op.COMMIT:
                return self._commit(m, inst, message)
            if message.op is Op.SWAP_IN:
                self.swap_in(m.name)
                return reply_to(message, m.epoch, {"state": str(m.state)})
            if message.op is Op.READOPT:
                return self._readopt(m, inst, message)
            raise ProtocolViolation(f"agent does not serve {message.op}")
        except EngineError as e:
            message.close_fds()
            return error_reply(message, 0, e.code, str(e))
        except RemoteError as e:
            message.close_fds()
            return error_reply(message, 0, e.code, e.message)

    def _register(self, peer: Peer, message: Message) -> Message:
        model = str(message.body.get("model", ""))
        instance = str(message.body.get("instance", "0"))
        pid = peer.peer_pid()
        if not self.voucher.vouch(pid, model):
            log.warning("refused client pid %d naming model %r: not vouched for", pid, model)
            raise NotVouched(f"pid {pid} is not vouched for as model {model!r}")
        m = self.model(model)
        with m.lock, self._mut:
            inst = m.instances.get(instance)
            if inst is None:
                inst = m.instances[instance] = InstanceRecord(instance)
            if inst.live and inst.peer is not peer:
                raise WrongState(f"instance {instance} of {model} is already connected")
            inst.peer = peer
            inst.pid = pid
            inst.last_heartbeat = None
            self._peers[id(peer)] = (model, instance)
            if not self._pid_in_use(m.config.gpu, pid, [inst]):
                self.budgets[m.config.gpu].process_attached(pid, self._measure(m.config.gpu, pid))
            body = {"epoch": m.epoch, "state": str(m.state), "committed": inst.committed}
        return reply_to(message, m.epoch, body)

    def _attach(self, m: ModelRecord, inst: InstanceRecord, message: Message) -> Message:
        specs = message.body.get("regions", [])
        layout: dict[str, RegionRecord] = {}
        for s in specs:
            size, address = int(s["bytes"]), int(s["address"])
            if size <= 0 or size % GRANULARITY_BYTES or address % GRANULARITY_BYTES:
                raise ProtocolViolation(f"region {s['tag']}: size/address not 2 MiB multiples")
            layout[str(s["tag"])] = RegionRecord(
                str(s["tag"]), size, RegionKind(s["kind"]), address
            )
        self._wait_recovered()
        with self._gpu_locks[m.config.gpu], m.lock:
            if inst.mapped:
                raise WrongState(f"instance {inst.name} of {m.name} is already attached")
            same = set(layout) == set(inst.regions) and all(
                (r.size_bytes, r.kind) == (inst.regions[t].size_bytes, inst.regions[t].kind)
                for t, r in layout.items()
            )
            with self._mut:
                if not same:  # a new layout: the old host copies do not fit it
                    for r in inst.regions.values():
                        for f in (r.weights_file, r.kv_file):
                            if f is not None:
                                self.store.delete(f)
                    inst.regions = layout
                    inst.committed = False
                else:
                    for t, r in layout.items():
                        inst.regions[t].address = r.address
            restored = inst.committed
            kv_fd = self._kv_host_tier(m, inst)  # before any mapping: HostStoreFull refuses
            try:
                self._bring_in_attached(m, inst)
            except BaseException:
                if kv_fd is not None:
                    self.close_fd(kv_fd)
                raise
        regions = [
            {"tag": t, "restored": restored and r.kind is RegionKind.WEIGHTS}
            for t, r in inst.regions.items()
        ]
        body: dict[str, Any] = {"restored": restored, "regions": regions, "state": str(m.state)}
        if kv_fd is None:
            return reply_to(message, m.epoch, body)
        body["kv_pool"] = {
            "offload_after_tokens": m.config.kv_offload_after_tokens,
            "host_bytes": m.config.kv_host_bytes,
            "fd": 0,
        }
        return reply_to(message, m.epoch, body, [kv_fd])  # the fd is closed once sent

    def _kv_host_tier(self, m: ModelRecord, inst: InstanceRecord) -> int | None:
        """A writable fd of the instance's KV host-tier file (made on first attach), or
        None when the model's policy has no host tier."""
        size = m.config.kv_host_bytes
        if m.config.kv_offload_after_tokens is None or size <= 0:
            return None
        f = inst.kv_host_file
        if f is not None and f.size_bytes != size:  # the policy changed its size
            self.store.delete(f)
            inst.kv_host_file = f = None
        if f is None:
            rel = self.store.relpath(m.config.gpu, m.name, inst.name, "kv-host-tier", "kvhost")
            f = self.store.commit(self.store.stage(m.config.gpu, rel, size))
            with self._mut:
                inst.kv_host_file = f
                self.persist()
        return self.store.open_writable(f)

    def _bring_in_attached(self, m: ModelRecord, inst: InstanceRecord) -> None:
        """Map (and restore) a newly attached instance, whatever the model's state."""
        if m.state is S.SWAPPED_OUT:
            self.swapper.swap_in_locked(m)
        elif m.state in (S.DROPPED, S.FAILED):
            self.swapper.reload_locked(m)
        elif m.state in (S.RESIDENT, S.LOADING):
            self.swapper.bring_in(m, [inst], track_states=False)
            m.last_used = time.monotonic()
            if m.state is S.LOADING and all(i.committed for i in m.live_instances()):
                self.set_state(m, S.RESIDENT, "restored from the host store")
            else:
                self.persist()
        else:
            raise WrongState(f"model {m.name} is {m.state}")

    def _commit(self, m: ModelRecord, inst: InstanceRecord, message: Message) -> Message:
        with m.lock:
            if inst.committed:
                return reply_to(message, m.epoch, {"committed": True})
            if not inst.mapped or inst.peer is None:
                raise WrongState(f"instance {inst.name} of {m.name} is not attached")
            weights = [r for r in inst.regions.values() if r.kind is RegionKind.WEIGHTS]
            stagings = []
            try:
                for r in weights:
                    rel = self.store.relpath(m.config.gpu, m.name, inst.name, r.tag, "weights")
                    stagings.append((r, self.store.stage(m.config.gpu, rel, r.size_bytes)))
                if stagings:
                    body = {
                        "regions": [
                            {"tag": r.tag, "fd": n, "bytes": r.size_bytes}
                            for n, (r, _) in enumerate(stagings)
                        ]
                    }
                    inst.peer.request(
                        Op.SAVE,
                        body,
                        m.epoch,
                        [st.fd for _, st in stagings],
                        timeout_seconds=self.settings.client_timeout_seconds,
                    )
            except BaseException:
                for _, st in stagings:
                    self.store.abort(st)
                raise
            self.checkpoint("commit.saved")
            committed = [(r, self.store.commit(st)) for r, st in stagings]
            self.checkpoint("commit.renamed")
            with self._mut:
                for r, stored in committed:
                    r.weights_file = stored
                inst.committed = True
                if m.state is S.LOADING and all(i.committed for i in m.live_instances()):
                    self.set_state(m, S.RESIDENT, "loaded; weights saved to the host store")
                else:
                    self.persist()  # after the data: the state file names whole copies only
        return reply_to(message, m.epoch, {"committed": True})

    def client_gone(self, peer: Peer) -> None:
        """A closed socket is a dead client: drop its handles, keep the host copies."""
        with self._mut:
            binding = self._peers.pop(id(peer), None)
        if binding is None:
            return
        try:
            m = self.model(binding[0])
        except UnknownModel:
            return
        with m.lock, self._mut:
            inst = m.instances.get(binding[1])
            if inst is None or inst.peer is not peer:
                return
            inst.peer = None
            self._detach_process(m.config.gpu, inst.pid, [inst])
            if inst.mapped:
                self.swapper.release_instance(m, inst)
                for r in inst.regions.values():  # its KV lived in HBM; a saved copy is stale
                    if r.kv_file is not None:
                        self.store.delete(r.kv_file)
                        r.kv_file = None
            if not any(i.mapped for i in m.instances.values()) and m.state in (
                S.RESIDENT,
                S.LOADING,
            ):
                complete = bool(m.instances) and all(i.committed for i in m.instances.values())
                m.state = S.SWAPPED_OUT if complete else S.LOADING
                m.reason = f"instance {inst.name} (pid {inst.pid}) exited"
            self.persist()
        log.info("model %s instance %s: client pid %d gone", m.name, inst.name, inst.pid)

    # -- recovery --------------------------------------------------------------------------

    def recover(self) -> None:
        """Load the state file after a restart; clients then have a grace period to readopt."""
        doc = self.store.read_state()
        models = from_doc(doc) if doc is not None else {}
        named = {
            f.relpath
            for m in models.values()
            for i in m.instances.values()
            for f in [
                i.kv_host_file,
                *(x for r in i.regions.values() for x in (r.weights_file, r.kv_file)),
            ]
            if f is not None
        }
        for rel in self.store.remove_unnamed(named):
            log.info("host store: removed %s, which the state file does not name", rel)
        if doc is None:
            return
        awaiting = False
        for m in models.values():
            for inst in m.instances.values():
                for r in inst.regions.values():
                    if r.weights_file is not None and not self.store.adopt_existing(r.weights_file):
                        r.weights_file = None
                        inst.committed = False
                    if r.kv_file is not None and not self.store.adopt_existing(r.kv_file):
                        r.kv_file = None
                if inst.kv_host_file is not None and not self.store.adopt_existing(
                    inst.kv_host_file
                ):
                    inst.kv_host_file = None
                if inst.mapped:
                    inst.mapped = False
                    inst.awaiting_readopt = True
                    awaiting = True
        for m in [m for m in models.values() if m.state is S.DELETING]:
            # the agent died while removing it: finish (no client maps it any more, or
            # its clients are told when they readopt and find no model)
            self.swapper.discard_host_copies(m)
            for inst in m.instances.values():
                if inst.kv_host_file is not None:
                    self.store.delete(inst.kv_host_file)
            del models[m.name]
        with self._mut:
            self._models = models
            for m in models.values():
                if not any(i.awaiting_readopt for i in m.instances.values()):
                    self._resolve(m)
            self.persist()
        if awaiting:
            self._recovered.clear()
            t = threading.Thread(target=self._grace, name="readopt-grace", daemon=True)
            t.start()

    def _grace(self) -> None:
        deadline = time.monotonic() + self.settings.readopt_grace_seconds
        while time.monotonic() < deadline and not self._recovered.is_set():
            self._recovered.wait(0.05)
        with self._mut:
            models = list(self._models.values())
        for m in models:
            with m.lock, self._mut:
                stale = [i for i in m.instances.values() if i.awaiting_readopt]
                for inst in stale:
                    inst.awaiting_readopt = False
                if stale:
                    self._resolve(m)
                    self.persist()
        self._recovered.set()

    def _wait_recovered(self) -> None:
        """Block until every instance readopted or the grace period ended (no-op otherwise)."""
        if self._recovered.is_set():
            return
        with self._mut:
            self._recovery_waiters += 1
        try:
            self._recovered.wait(self.settings.readopt_grace_seconds + 5)
        finally:
            with self._mut:
                self._recovery_waiters -= 1

    @property
    def recovering(self) -> bool:
        """After a restart, until every instance readopted or the grace period ended."""
        return not self._recovered.is_set()

    @property
    def recovery_waiters(self) -> int:
        """Operations (swap-in, swap-out, attach) held until recovery ends."""
        with self._mut:
            return self._recovery_waiters

    def _resolve(self, m: ModelRecord) -> None:
        """Settle a model's state from what its clients readopted (recovery only)."""
        mapped = [i for i in m.instances.values() if i.mapped]
        unmapped_live = [i for i in m.live_instances() if not i.mapped]
        complete = bool(m.instances) and all(i.committed for i in m.instances.values())
        if not mapped and m.state in (S.DROPPED, S.FAILED):
            return  # nothing held either way; a swap-in reloads it
        if mapped:
            m.state = S.RESIDENT if all(i.committed for i in mapped) else S.LOADING
            if unmapped_live and m.state is S.RESIDENT:
                # the agent died between two instances' unmaps: finish that swap-out
                threading.Thread(target=self._finish_swap_out, args=(m,), daemon=True).start()
        else:
            m.state = S.SWAPPED_OUT if complete else S.LOADING
        m.reason = "recovered after an agent restart"

    def _finish_swap_out(self, m: ModelRecord) -> None:
        try:
            self.swap_out(m.name, "completing a swap-out interrupted by an agent restart")
        except EngineError as e:
            log.warning("model %s: could not complete the interrupted swap-out: %s", m.name, e)

    def _readopt(self, m: ModelRecord, inst: InstanceRecord, message: Message) -> Message:
        body = message.body
        try:
            with m.lock, self._mut:
                regions = {str(r["tag"]): r for r in body.get("regions", [])}
                for tag, rd in regions.items():
                    if tag not in inst.regions:
                        inst.regions[tag] = RegionRecord(
                            tag, int(rd["bytes"]), RegionKind(rd["kind"]), int(rd["address"])
                        )
                if body.get("state") in ("resident", "loading") and not inst.mapped:
                    location = Location.device(m.config.gpu)
                    for tag, rd in regions.items():
                        r = inst.regions[tag]
                        for c in rd.get("chunks", []):
                            fd = message.fds[int(c["fd"])]
                            chunk = self.allocator.adopt_fd(location, fd, int(c["bytes"]))
                            self.budgets[m.config.gpu].force_charge(chunk.size_bytes)
                            r.chunks.append(chunk)
                        if r.kv_file is not None:
                            self.store.delete(r.kv_file)
                            r.kv_file = None
                    inst.mapped = True
                inst.awaiting_readopt = False
                m.epoch = max(m.epoch, int(message.epoch)) + 1
                if not any(i.awaiting_readopt for i in m.instances.values()):
                    self._resolve(m)
                self.persist()
                if not any(
                    i.awaiting_readopt
                    for mm in self._models.values()
                    for i in mm.instances.values()
                ):
                    self._recovered.set()
                reply = {"state": str(m.state), "committed": inst.committed}
        finally:
            message.close_fds()
        return reply_to(message, m.epoch, reply)

    # -- per-process overhead and heartbeats ---------------------------------------------

    def _pid_in_use(self, gpu: int, pid: int, ignore: list[InstanceRecord]) -> bool:
        """Whether another live instance on `gpu` runs in process `pid` (overhead is per
        process, however many instances it serves)."""
        with self._mut:
            return any(
                i.live and i.pid == pid and all(i is not x for x in ignore)
                for m in self._models.values()
                if m.config.gpu == gpu
                for i in m.instances.values()
            )

    def _detach_process(self, gpu: int, pid: int, ignore: list[InstanceRecord]) -> None:
        if not self._pid_in_use(gpu, pid, ignore):
            self.budgets[gpu].process_detached(pid)

    def _measure(self, gpu: int, pid: int) -> int | None:
        """The allocator's measurement of `pid`'s overhead on `gpu` (None: not measured)."""
        with self._mut:
            mapped = sum(
                i.chunk_bytes()
                for m in self._models.values()
                if m.config.gpu == gpu
                for i in m.instances.values()
                if i.live and i.pid == pid
            )
        try:
            measured = self.allocator.process_overhead_bytes(
                Location.device(gpu), [pid], {pid: mapped}
            )
        except Exception as e:  # a measurement never breaks registration
            log.warning("GPU %d: measuring pid %d's overhead failed: %s", gpu, pid, e)
            return None
        return measured.get(pid)

    def _heartbeat(self, m: ModelRecord, inst: InstanceRecord, message: Message) -> Message:
        """Record the client's heartbeat and refresh its process's overhead measurement
        (a CUDA context appears after the process registered)."""
        if inst.heartbeat_late:
            log.info("model %s instance %s (pid %d): heartbeats again", m.name, inst.name, inst.pid)
        inst.last_heartbeat = time.monotonic()
        inst.heartbeat_late = False
        self.budgets[m.config.gpu].set_measured(inst.pid, self._measure(m.config.gpu, inst.pid))
        return reply_to(message, m.epoch)

    def _watch_heartbeats(self) -> None:
        """Log clients whose heartbeats stopped; nothing else (a closed socket, not a
        silent one, is a dead client)."""
        timeout = self.settings.heartbeat_timeout_seconds
        while not self._stop.wait(min(max(timeout / 4, 0.05), 5.0)):
            now = time.monotonic()
            with self._mut:
                late = [
                    (m, i)
                    for m in self._models.values()
                    for i in m.instances.values()
                    if i.live
                    and i.last_heartbeat is not None
                    and not i.heartbeat_late
                    and now - i.last_heartbeat > timeout
                ]
                for _, i in late:
                    i.heartbeat_late = True
            for m, i in late:
                log.warning(
                    "model %s instance %s (pid %d): no heartbeat for %.1f s",
                    m.name,
                    i.name,
                    i.pid,
                    now - (i.last_heartbeat or now),
                )

    def close(self) -> None:
        self._stop.set()
        self._monitor.join(timeout=5)
        with self._mut:
            peers = [i.peer for m in self._models.values() for i in m.instances.values() if i.peer]
        for p in peers:
            p.close()


def error_code_of(e: BaseException) -> ErrorCode:
    return e.code if isinstance(e, EngineError) else ErrorCode.INTERNAL


def as_dict(status: ModelStatus) -> dict[str, Any]:
    return {
        "name": status.name,
        "gpu": status.gpu,
        "state": str(status.state),
        "phase": status.phase,
        "epoch": status.epoch,
        "resident_bytes": status.resident_bytes,
        "instances": status.instances,
        "swap_ins": status.swap_ins,
        "swap_outs": status.swap_outs,
        "last_swap_in_seconds": status.last_swap_in_seconds,
        "kv_discarded": status.kv_discarded,
        "reason": status.reason,
        "last_heartbeat_ages_seconds": status.last_heartbeat_ages_seconds,
        "last_swap_in_copy": status.last_swap_in_copy.as_doc(),
    }
