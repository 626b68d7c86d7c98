"""What an attachment holds: its state machine, regions, mappings and host buffers, and
how it lets them go. The base of `client.Attachment`; the connection, the swap handling
and the copies are layered on it (`_connecting`, `_swapping`, `_copying`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from modelswap_api.wire import Peer, StrEnum
from modelswap_client.mappers.base import HostBuffer, Mapper
from modelswap_client.regions import Region


class ClientState(StrEnum):
    DETACHED = "detached"
    RESIDENT = "resident"
    DRAINING = "draining"
    QUIESCED = "quiesced"
    SWAPPED_OUT = "swapped_out"
    MAPPED = "mapped"  # swap-in: mapped, not yet restored
    REMOVED = "removed"  # the model was deleted: nothing mapped, never again


class AttachmentState:
    """One model instance's state, regions and mappings (no behaviour beyond letting them
    go); `client.Attachment` adds the rest."""

    def __init__(
        self,
        model: str,
        instance: str,
        socket_path: str,
        mapper: Mapper,
        *,
        timeout_seconds: float,
        reconnect_timeout_seconds: float,
        copy_piece_bytes: int,
        heartbeat_interval_seconds: float = 5.0,
    ) -> None:
        self.model = model
        self.instance = instance
        self.socket_path = socket_path
        self.mapper = mapper
        self.timeout_seconds = timeout_seconds
        self.reconnect_timeout_seconds = reconnect_timeout_seconds
        self.copy_piece_bytes = copy_piece_bytes
        self.heartbeat_interval_seconds = heartbeat_interval_seconds
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self.regions: dict[str, Region] = {}
        self.restored = False
        self.committed = False
        self.kv_discarded = False
        #: the last swap-out dropped the model (onSwapOut: drop): the next swap-in maps
        #: fresh memory and the runtime reloads from the source (see `restored`)
        self.dropped = False
        self.epoch = 0
        self._state = ClientState.DETACHED
        self._cond = threading.Condition()
        self._op_lock = threading.RLock()
        self._in_use = 0
        self._drain_token: object | None = None
        self._generation = 0
        self._closing = False
        self._connected = threading.Event()
        self._peer: Peer | None = None
        self._reservations: list[Any] = []
        #: the KV pool policy the agent sent at attach (`kv_pool`), and the host tier: the
        #: writable mapping of an agent-owned host-store file
        self.kv_offload_after_tokens: int | None = None
        self.kv_host_bytes = 0
        self._kv_host: HostBuffer | None = None
        #: region tag → ((st_dev, st_ino, bytes) of its weight copy, read-only host mapping)
        self._weight_sources: dict[str, tuple[tuple[int, int, int], HostBuffer]] = {}
        self._on_swap_out: list[Callable[[Any], None]] = []
        self._on_swap_in: list[Callable[[Any], None]] = []
        self._on_readopt: list[Callable[[Any], None]] = []

    @property
    def state(self) -> ClientState:
        with self._cond:
            return self._state

    def _set_state(self, state: ClientState) -> None:
        with self._cond:
            self._state = state
            if state is not ClientState.DRAINING and state is not ClientState.QUIESCED:
                self._drain_token = None
            self._cond.notify_all()

    def _unmap_all(self) -> None:
        for r in self.regions.values():
            for offset, size, h in r.handles:
                self.mapper.unmap(r.address + offset, size)
                self.mapper.release(h)
            r.handles = []

    def _drop_kv_host_tier(self) -> None:
        if self._kv_host is not None:
            self.mapper.unmap_host(self._kv_host)
            self._kv_host = None
