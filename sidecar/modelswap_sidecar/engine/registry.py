"""The registry of models: the engine's fields, lookups, state changes and the state
file, per-model status, and waiting out recovery. The base of `core.Engine`; processes,
the control operations, recovery, attaching and the client protocol are layered on it
(`processes`, `operations`, `recovery`, `attaching`, `clients`)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from modelswap_sidecar.allocators.base import Allocator
from modelswap_sidecar.engine.budget import BudgetView, HbmBudget
from modelswap_sidecar.engine.errors import UnknownModel, WrongState
from modelswap_sidecar.engine.events import SwapEvent, SwapListener
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import ModelConfig, ModelRecord, to_doc
from modelswap_sidecar.engine.settings import EngineSettings
from modelswap_sidecar.engine.states import PHASES, EngineState, check_transition
from modelswap_sidecar.engine.status import ModelStatus
from modelswap_sidecar.engine.swaps import Swapper
from modelswap_sidecar.engine.vouching import Voucher

log = logging.getLogger(__name__)


class Registry:
    """The models and their state; `core.Engine.__init__` sets every field."""

    allocator: Allocator
    store: HostStore
    voucher: Voucher
    settings: EngineSettings
    checkpoint: Callable[[str], None]
    budgets: dict[int, HbmBudget]
    swapper: Swapper
    _models: dict[str, ModelRecord]
    _peers: dict[int, tuple[str, str]]  # id(peer) → (model, instance)
    _mut: threading.RLock
    _gpu_locks: dict[int, threading.Lock]
    _recovered: threading.Event
    _recovery_waiters: int
    _swap_listeners: list[SwapListener]
    _client_swap_in: Callable[[str], None] | None
    _stop: threading.Event
    _monitor: threading.Thread

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

    # -- swap events ---------------------------------------------------------------------

    def subscribe(self, listener: SwapListener) -> None:
        """Call `listener` with every completed swap (from the thread that did it)."""
        self._swap_listeners.append(listener)

    def emit(self, event: SwapEvent) -> None:
        for listener in list(self._swap_listeners):
            try:
                listener(event)
            except Exception:
                log.exception("swap listener failed on %s", event)

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

    # -- waiting out recovery --------------------------------------------------------------

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
