"""The engine's facade: builds the model table, the GPU ledger, the transport to clients,
the swapper, recovery and the client protocol, and exposes what the agent, the protocol
server and the tests call, reads included, so nothing outside the engine reads records.

Thread model: each model has an operation lock held for a whole operation (swap-in,
swap-out, attach, commit, readopt, removal; a commit that comes in while a swap-out
drains the model runs beside it instead, `Attacher.commit`); each GPU has an allocation
lock (the ledger's) held by swap-ins and attaches so two of them on one GPU never evict
each other;
the table's lock guards records for short mutations and the state file. Client round
trips never hold the table's lock. Operations run on their callers' threads (the agent's
worker threads; a connection's handler threads for client requests, `engine/server.py`);
the engine's own threads are the heartbeat watcher and, after a restart, the readopt
grace timer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from modelswap_api.wire import ErrorCode, Message, Peer
from modelswap_sidecar.allocators.base import Allocator
from modelswap_sidecar.engine.attaching import Attacher
from modelswap_sidecar.engine.budget import BudgetView
from modelswap_sidecar.engine.errors import EngineError, UnknownModel
from modelswap_sidecar.engine.events import SwapEvents, SwapListener
from modelswap_sidecar.engine.heartbeats import Heartbeats, Unresponsive, UnresponsiveListener
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.ledger import GpuLedger
from modelswap_sidecar.engine.protocol import ClientProtocol
from modelswap_sidecar.engine.records import ModelConfig
from modelswap_sidecar.engine.recovery import Recovery
from modelswap_sidecar.engine.settings import CHECKPOINTS, EngineSettings, no_checkpoint
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.status import ModelStatus, as_dict
from modelswap_sidecar.engine.swaps import DrainOverdueListener, Swapper
from modelswap_sidecar.engine.table import ModelTable
from modelswap_sidecar.engine.transport import PeerTransport
from modelswap_sidecar.engine.vouching import Voucher

__all__ = [
    "CHECKPOINTS",
    "Engine",
    "EngineSettings",
    "ModelStatus",
    "SwapInDecider",
    "Unresponsive",
    "as_dict",
    "error_code_of",
]


#: Decides a client's own swap-in (its `in_use()` on a swapped-out model): it chooses the
#: victims (or refuses, raising an EngineError the client receives) and calls
#: `Engine.swap_in`. The agent's is `Actuator.decide_client_swap_in`.
SwapInDecider = Callable[[str], None]


class Engine:
    """`decider` decides every client's own swap-in (`SwapInDecider`): the engine never
    swaps one in on its own. `checkpoint(name)` is called at named points inside operations
    (see CHECKPOINTS); fault tests pass one that pauses there, so an agent can be killed
    exactly mid-operation.
    """

    def __init__(
        self,
        allocator: Allocator,
        store: HostStore,
        voucher: Voucher,
        settings: EngineSettings | None = None,
        checkpoint: Callable[[str], None] = no_checkpoint,
        *,
        decider: SwapInDecider,
    ) -> None:
        settings = settings or EngineSettings()
        self.settings = settings
        self._store = store
        self._events = SwapEvents()
        self._table = ModelTable(store)
        self._ledger = GpuLedger(allocator, self._table, settings)
        self._transport = PeerTransport()
        self._swapper = Swapper(
            table=self._table,
            ledger=self._ledger,
            transport=self._transport,
            store=store,
            settings=settings,
            events=self._events,
            checkpoint=checkpoint,
        )
        self._recovery = Recovery(self._table, self._ledger, self._swapper, store, settings)
        self._heartbeats = Heartbeats(
            self._table,
            self._ledger,
            settings.heartbeat_timeout_seconds,
            settings.unresponsive_after_seconds,
        )
        attacher = Attacher(
            table=self._table,
            ledger=self._ledger,
            swapper=self._swapper,
            recovery=self._recovery,
            transport=self._transport,
            store=store,
            settings=settings,
            checkpoint=checkpoint,
        )
        self._protocol = ClientProtocol(
            table=self._table,
            ledger=self._ledger,
            attacher=attacher,
            recovery=self._recovery,
            heartbeats=self._heartbeats,
            store=store,
            voucher=voucher,
            swap_in=decider,
            pace_bytes_per_second=settings.pace_bytes_per_second,
        )
        self._heartbeats.start()

    def close(self) -> None:
        self._heartbeats.close()
        for peer in self._table.connected_peers():
            peer.close()

    # -- models --------------------------------------------------------------------------

    def add_model(self, config: ModelConfig) -> None:
        if config.gpu not in self._ledger.gpus:
            raise UnknownModel(f"model {config.name}: no GPU {config.gpu} on this node")
        self._table.add(config)

    def remove_model(self, name: str) -> None:
        """DELETING: every client is told (it unmaps and detaches for good), every chunk is
        released, every host-store copy deleted, and the model forgotten."""
        m = self._table.get(name)
        with m.lock:
            self._swapper.remove_locked(m)

    # -- swaps ---------------------------------------------------------------------------

    def swap_out(self, name: str, reason: str = "") -> None:
        m = self._table.get(name)
        # right after a restart the engine does not know yet which instances map chunks
        # (they come back through readopt): a swap-out now would unmap nothing and report
        # success while the clients, once readopted, still hold the memory
        self._recovery.wait()
        with m.lock:
            self._swapper.swap_out_locked(m, reason)

    def swap_in(self, name: str, victims: Sequence[str] = ()) -> None:
        """Swap the model in, making room by swapping out `victims` (engine model names,
        in order, as many as it takes: the caller's decision; the engine chooses nobody)."""
        m = self._table.get(name)
        self._recovery.wait()
        with self._ledger.allocation_lock(m.config.gpu), m.lock:
            self._swapper.swap_in_locked(m, victims)

    def on_drain_overdue(self, listener: DrainOverdueListener) -> None:
        """Call `listener(name)` (on a timer thread; it must not block) when a swap-out's
        drain has waited `settings.drain_timeout_seconds` for the model's `in_use()` work:
        it ends that work (the agent's gateway cancels the model's requests), and the drain
        waits `settings.drain_end_grace_seconds` more. Without one, the swap-out rolls back
        at the timeout."""
        self._swapper.drain_overdue = listener

    def on_unresponsive(self, listener: UnresponsiveListener) -> None:
        """Call `listener` (on the heartbeat watcher's thread) with each connected client
        that sent no heartbeat for `settings.unresponsive_after_seconds`, once per silence.
        The engine does nothing else about it: a socket that closes (the listener ended the
        process) releases the client's memory, as for any dead client."""
        self._heartbeats.on_unresponsive(listener)

    def subscribe(self, listener: SwapListener) -> None:
        """Call `listener` with every completed swap (from the thread that did it)."""
        self._events.subscribe(listener)

    # -- clients -------------------------------------------------------------------------

    def handle(self, peer: Peer, message: Message) -> Message | None:
        """Serve one client request (on one of its connection's handler threads)."""
        return self._protocol.handle(peer, message)

    def client_gone(self, peer: Peer) -> None:
        """A closed socket is a dead client: drop its handles, keep the host copies."""
        self._protocol.client_gone(peer)

    def registered(self, peer: Peer) -> bool:
        """Whether `peer` registered as an instance of a model (and is still bound)."""
        return self._table.binding(peer) is not None

    # -- recovery ------------------------------------------------------------------------

    def recover(self) -> None:
        """Load the state file after a restart; clients then have a grace period to readopt."""
        self._recovery.recover()

    @property
    def recovering(self) -> bool:
        """After a restart, until every instance readopted or the grace period ended."""
        return self._recovery.recovering

    @property
    def recovery_waiters(self) -> int:
        """Operations (swap-in, swap-out, attach) held until recovery ends."""
        return self._recovery.waiters

    @property
    def readopt_grace_seconds(self) -> float:
        """How long clients have to readopt after a restart."""
        return self._recovery.grace_seconds

    # -- reads ---------------------------------------------------------------------------

    def status(self, name: str) -> ModelStatus:
        return self._table.status(name)

    def statuses(self) -> list[ModelStatus]:
        return self._table.statuses()

    def state(self, name: str) -> EngineState:
        """The model's state alone (UnknownModel: no such model): what a per-request
        residency check reads, without building its whole status."""
        return self._table.get(name).state

    def gpu_of(self, name: str) -> int:
        """The GPU the model lives on (UnknownModel: no such model)."""
        return self._table.gpu_of(name)

    def host_bytes_of(self, name: str) -> int:
        """Bytes the model holds in the host store: weights, preserved KV, the KV host
        tier (UnknownModel: no such model)."""
        return self._table.host_bytes_of(name)

    @property
    def gpus(self) -> tuple[int, ...]:
        return self._ledger.gpus

    def budget(self, gpu: int) -> BudgetView:
        return self._ledger.view(gpu)

    def host_store_bytes(self, gpu: int) -> int:
        """Bytes of `gpu`'s host-store copies."""
        return self._store.used_bytes(gpu)

    def host_store_capacity_bytes(self, gpu: int) -> int:
        return self._store.capacities_bytes.get(gpu, 0)


def error_code_of(e: BaseException) -> ErrorCode:
    return e.code if isinstance(e, EngineError) else ErrorCode.INTERNAL
