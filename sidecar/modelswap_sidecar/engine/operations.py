"""The control operations: swap out, swap in, remove, touch (the agent's control API
calls these; a client's swap-in request too)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from modelswap_api.wire import Op
from modelswap_sidecar.engine.processes import Processes
from modelswap_sidecar.engine.states import EngineState

log = logging.getLogger(__name__)
S = EngineState


class Operations(Processes):
    """Whole-model operations, each under the model's operation lock."""

    def swap_out(self, name: str, reason: str = "") -> None:
        m = self.model(name)
        # right after a restart the engine does not know yet which instances map chunks
        # (they come back through readopt): a swap-out now would unmap nothing and report
        # success while the clients, once readopted, still hold the memory
        self._wait_recovered()
        with m.lock:
            self.swapper.swap_out_locked(m, reason)

    def swap_in(self, name: str, victims: Sequence[str] = ()) -> None:
        """Swap the model in, making room by swapping out `victims` (engine model names,
        in order, as many as it takes: the caller's decision; the engine chooses nobody)."""
        m = self.model(name)
        self._wait_recovered()
        with self._gpu_locks[m.config.gpu], m.lock:
            self.swapper.swap_in_locked(m, victims)

    def on_client_swap_in(self, decider: Callable[[str], None]) -> None:
        """Route a client's own swap-in request (its `in_use()` on a swapped-out model)
        to `decider(name)`, which decides (victims, or a refusal raised as an EngineError)
        and calls `swap_in`. Without one, the engine swaps in with no victims."""
        self._client_swap_in = decider

    def client_swap_in(self, name: str) -> None:
        decider = self._client_swap_in
        if decider is None:
            self.swap_in(name)
        else:
            decider(name)

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
