"""The engine: the registry of models, the client-facing handlers, and recovery.

Thread model: each model has an operation lock held for a whole operation (swap-in,
swap-out, attach, commit, readopt); each GPU has an allocation lock held by swap-ins so two
swap-ins on one GPU never evict each other; `_mut` guards records for short mutations and
the state file. Client round trips never hold `_mut`.

The engine is layered one concern a module: `registry` (fields, lookups, state file,
status) ← `processes` (per-process overhead, heartbeats) ← `operations` (swap out/in,
remove) ← `recovery` (state file reload, readopt) ← `attaching` (attach, commit) ←
`clients` (the client protocol) ← `Engine` here, which builds it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from modelswap_api.wire import ErrorCode
from modelswap_sidecar.allocators.base import Allocator
from modelswap_sidecar.engine.budget import HbmBudget
from modelswap_sidecar.engine.clients import Clients
from modelswap_sidecar.engine.errors import EngineError
from modelswap_sidecar.engine.events import SwapListener
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import ModelRecord
from modelswap_sidecar.engine.settings import CHECKPOINTS, EngineSettings, no_checkpoint
from modelswap_sidecar.engine.status import ModelStatus, as_dict
from modelswap_sidecar.engine.swaps import Swapper
from modelswap_sidecar.engine.vouching import Voucher

__all__ = ["CHECKPOINTS", "Engine", "EngineSettings", "ModelStatus", "as_dict", "error_code_of"]


class Engine(Clients):
    """`checkpoint(name)` is called at named points inside operations (see CHECKPOINTS);
    fault tests pass one that pauses there, so an agent can be killed exactly mid-operation.
    """

    def __init__(
        self,
        allocator: Allocator,
        store: HostStore,
        voucher: Voucher,
        settings: EngineSettings | None = None,
        checkpoint: Callable[[str], None] = no_checkpoint,
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
        self._swap_listeners: list[SwapListener] = []
        self._client_swap_in: Callable[[str], None] | None = None
        self.swapper = Swapper(self)
        self._stop = threading.Event()
        self._monitor = threading.Thread(
            target=self._watch_heartbeats, name="engine-heartbeats", daemon=True
        )
        self._monitor.start()

    def close(self) -> None:
        self._stop.set()
        self._monitor.join(timeout=5)
        with self._mut:
            peers = [i.peer for m in self._models.values() for i in m.instances.values() if i.peer]
        for p in peers:
            p.close()


def error_code_of(e: BaseException) -> ErrorCode:
    return e.code if isinstance(e, EngineError) else ErrorCode.INTERNAL
