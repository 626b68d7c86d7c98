"""The model table: every model's record, the lock that guards them, the state file, the
clients' socket bindings, and what the engine reports about a model.

`lock` guards the records' fields and the table itself for short mutations and reads, and
the state file's writes (taken inside a model's operation lock, never around a client
round trip). A record's own `lock` (the operation lock) is its holder's to take.
"""

from __future__ import annotations

import logging
import threading
import time

from modelswap_api.wire import Peer
from modelswap_sidecar.engine.errors import UnknownModel, WrongState
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import (
    InstanceRecord,
    KvReport,
    ModelConfig,
    ModelRecord,
    to_doc,
)
from modelswap_sidecar.engine.states import PHASES, EngineState, check_transition
from modelswap_sidecar.engine.status import ModelStatus

log = logging.getLogger(__name__)


class ModelTable:
    def __init__(self, store: HostStore) -> None:
        self.store = store
        self.lock = threading.RLock()
        #: notified (under `lock`) whenever a record's `commits` or `joined_commits` falls
        self.commits_done = threading.Condition(self.lock)
        self._models: dict[str, ModelRecord] = {}
        self._peers: dict[int, tuple[str, str]] = {}  # id(peer) → (model, instance)

    # -- records -------------------------------------------------------------------------

    def add(self, config: ModelConfig) -> None:
        """Add a model, or replace the configuration of one on the same GPU."""
        with self.lock:
            m = self._models.get(config.name)
            if m is None:
                self._models[config.name] = ModelRecord(config)
            else:
                if m.config.gpu != config.gpu:
                    raise WrongState(f"model {config.name} lives on GPU {m.config.gpu}")
                m.config = config
            self.persist()

    def get(self, name: str) -> ModelRecord:
        with self.lock:
            m = self._models.get(name)
        if m is None:
            raise UnknownModel(f"no model {name!r}")
        return m

    def records(self) -> list[ModelRecord]:
        with self.lock:
            return list(self._models.values())

    def instances_on_gpu(self, gpu: int) -> list[InstanceRecord]:
        """Every instance of every model on `gpu` (a snapshot; read under `lock`)."""
        with self.lock:
            return [
                i
                for m in self._models.values()
                if m.config.gpu == gpu
                for i in m.instances.values()
            ]

    def replace_all(self, models: dict[str, ModelRecord]) -> None:
        """Recovery: the records read back from the state file (caller holds `lock`)."""
        self._models = models

    def forget(self, m: ModelRecord) -> None:
        """Drop a removed model's record and its clients' bindings (caller holds `lock`)."""
        for inst in m.instances.values():
            if inst.peer is not None:
                self._peers.pop(id(inst.peer), None)
        del self._models[m.name]
        self.persist()

    # -- states and the state file -------------------------------------------------------

    def set_state(
        self, m: ModelRecord, state: EngineState, reason: str = "", *, persist: bool = True
    ) -> None:
        """Move `m` to `state`; `persist=False` for transient steps whose state file entry
        recovery would never use (it rebuilds them from what clients readopt)."""
        with self.lock:
            check_transition(m.state, state)
            log.debug("model %s: %s → %s (%s)", m.name, m.state, state, reason)
            m.state = state
            if reason:
                m.reason = reason
            if persist:
                self.persist()

    def persist(self) -> None:
        with self.lock:
            self.store.write_state(to_doc(self._models))

    # -- clients' sockets ----------------------------------------------------------------

    def bind(self, peer: Peer, model: str, instance: str) -> None:
        """Requests from `peer` act for `instance` of `model` (caller holds `lock`)."""
        self._peers[id(peer)] = (model, instance)

    def binding(self, peer: Peer) -> tuple[str, str] | None:
        return self._peers.get(id(peer))

    def unbind(self, peer: Peer) -> tuple[str, str] | None:
        with self.lock:
            return self._peers.pop(id(peer), None)

    def connected_peers(self) -> list[Peer]:
        with self.lock:
            return [i.peer for m in self._models.values() for i in m.instances.values() if i.peer]

    # -- what callers read ---------------------------------------------------------------

    def status(self, name: str) -> ModelStatus:
        m = self.get(name)
        now = time.monotonic()
        with self.lock:
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
                sum((i.kv_report for i in m.live_instances()), KvReport()),
            )

    def statuses(self) -> list[ModelStatus]:
        with self.lock:
            names = list(self._models)
        return [self.status(n) for n in names]

    def gpu_of(self, name: str) -> int:
        return self.get(name).config.gpu

    def host_bytes_of(self, name: str) -> int:
        """Bytes the model holds in the host store: weights, preserved KV, the KV host tier."""
        m = self.get(name)
        with self.lock:
            total = 0
            for inst in m.instances.values():
                if inst.kv_host_file is not None:  # the tiered KV pool's host tier
                    total += inst.kv_host_file.size_bytes
                for r in inst.regions.values():
                    for stored in (r.weights_file, r.kv_file):
                        if stored is not None:
                            total += stored.size_bytes
            return total
