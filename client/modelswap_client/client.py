"""The client library: a model process's regions at stable addresses, paged by the agent.

    from modelswap_client.client import attach, RegionSpec
    att = attach("llama", [RegionSpec("weights", 512 << 20), RegionSpec("kv", 64 << 20, "kv")])
    if not att.restored:
        load_weights_into(att.regions["weights"].view())
        att.commit()                      # written once to the host store
    with att.in_use():                    # blocks swap-out; swaps in first if needed
        run(att.regions["weights"].address)

Standard library only (plus `modelswap_api.wire`); numpy/torch/cupy views import those
only when asked for (`Region.numpy/torch/cupy`); none of them is a dependency. Importing
this module makes the process non-dumpable (`PR_SET_DUMPABLE 0`) and raises its soft fd
limit to the hard limit.

Each region's address range is reserved once; on every swap-in the agent's fresh chunks
are mapped at the same addresses, so pointers stay valid. After an agent restart the
client reconnects and readopts: it re-exports every chunk it maps (the sim mapper keeps a
dup of each chunk fd for this), so no byte is copied and none is lost. Operations the
agent started but did not finish are rolled back locally first: a drained model resumes,
a half-mapped swap-in is unmapped.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelswap_api.wire import (
    ConnectionLost,
    ErrorCode,
    Message,
    Op,
    Peer,
    RegionKind,
    RemoteError,
    error_reply,
    reply_to,
)
from modelswap_client import _libc
from modelswap_client.cuda_views import DTYPES, CudaView
from modelswap_client.kvpool import TieredKvPool
from modelswap_client.mappers.base import (
    GRANULARITY_BYTES,
    CopyEvent,
    Handle,
    HostBuffer,
    Mapper,
    get_mapper,
)

log = logging.getLogger(__name__)

SOCKET_ENV = "MODELSWAP_SOCKET"
DEFAULT_COPY_PIECE_BYTES = 32 << 20

_libc.set_not_dumpable()
_libc.raise_fd_limit()


class ClientError(Exception):
    """The agent refused or failed a request; `code` is the wire error code."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INTERNAL) -> None:
        super().__init__(message)
        self.code = code


class ClientState(enum.StrEnum):
    DETACHED = "detached"
    RESIDENT = "resident"
    DRAINING = "draining"
    QUIESCED = "quiesced"
    SWAPPED_OUT = "swapped_out"
    MAPPED = "mapped"  # swap-in: mapped, not yet restored
    REMOVED = "removed"  # the model was deleted: nothing mapped, never again


@dataclass(frozen=True, slots=True)
class RegionSpec:
    tag: str
    size_bytes: int
    kind: RegionKind | str = RegionKind.WEIGHTS


@dataclass(slots=True)
class Region:
    """A region at a stable address. Views are valid while the model is resident (inside
    `in_use()`): after a swap-out the addresses fault until the next swap-in."""

    tag: str
    kind: RegionKind
    size_bytes: int  # as asked for
    reserved_bytes: int  # rounded up to the 2 MiB granularity
    address: int
    restored: bool = False
    handles: list[tuple[int, int, Handle]] = field(default_factory=list)  # (offset, size, h)
    #: GPU memory (cuda-vmm, managed) rather than the sim's host memory
    on_device: bool = False
    #: the CPU may touch it (sim; managed memory is unified); cuda-vmm memory it may not
    host_accessible: bool = True
    device_ordinal: int = 0  # the GPU of on-device memory

    def view(self) -> memoryview:
        """A writable byte view of the region (memory the CPU may touch: sim, managed)."""
        if not self.host_accessible:
            raise ClientError(
                f"region {self.tag} is GPU memory: use torch() or cupy()", ErrorCode.BAD_REQUEST
            )
        buf = (ctypes.c_char * self.size_bytes).from_address(self.address)
        return memoryview(buf).cast("B")

    def numpy(self, dtype: str = "uint8") -> Any:
        """A numpy array over the region (host memory; numpy is imported only here)."""
        import numpy as np  # noqa: PLC0415 - optional, imported at use

        return np.frombuffer(self.view(), dtype=dtype)

    def cuda_view(self, dtype: str = "uint8") -> CudaView:
        """The region's GPU memory as `__cuda_array_interface__` and DLPack (no import)."""
        if not self.on_device:
            raise ClientError(
                f"region {self.tag} is host memory (sim): use numpy() or torch()",
                ErrorCode.BAD_REQUEST,
            )
        itemsize = DTYPES[dtype][2] // 8 if dtype in DTYPES else 1
        return CudaView(
            self.address,
            self.size_bytes - self.size_bytes % itemsize,
            device=self.device_ordinal,
            dtype=dtype,
            managed=self.host_accessible,
        )

    def torch(self, dtype: str = "uint8") -> Any:
        """A torch tensor over the region, no copy: on its CUDA device for GPU memory
        (DLPack, `cuda_view`), on the CPU for the sim backend (`torch.frombuffer`). torch
        is imported only here; it is not a dependency."""
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        if self.on_device:
            return torch.from_dlpack(self.cuda_view(dtype))
        return torch.frombuffer(self.view(), dtype=torch.uint8).view(getattr(torch, dtype))

    def cupy(self, dtype: str = "uint8") -> Any:
        """A cupy array over the region's GPU memory, no copy (cupy imported only here)."""
        view = self.cuda_view(dtype)
        import cupy  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        return cupy.asarray(view)


def _round_up(n: int) -> int:
    return -(-n // GRANULARITY_BYTES) * GRANULARITY_BYTES


Handler = Callable[["Attachment"], None]


class Attachment:
    """One model instance's regions and its connection to the agent."""

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
        self._on_swap_out: list[Handler] = []
        self._on_swap_in: list[Handler] = []
        self._on_readopt: list[Handler] = []

    # -- public --------------------------------------------------------------------------

    @property
    def state(self) -> ClientState:
        with self._cond:
            return self._state

    def on_swap_out(self, handler: Handler) -> None:
        """Run after in-flight work drained, before the memory is unmapped."""
        self._on_swap_out.append(handler)

    def on_swap_in(self, handler: Handler) -> None:
        """Run after a swap-in restored every region."""
        self._on_swap_in.append(handler)

    def on_readopt(self, handler: Handler) -> None:
        """Run after reconnecting to a restarted agent."""
        self._on_readopt.append(handler)

    def kv_pool(self, tag: str, *, block_bytes: int, tokens_per_block: int) -> TieredKvPool:
        """A tiered KV pool over KV region `tag` (the HBM tier), configured by the model's
        policy: sequences longer than `offloadAfterTokens` get blocks from the host tier,
        `hostBytes` of an agent-owned host-store file (LRU when full). Without a host tier
        in the policy, every block comes from HBM."""
        r = self.regions[tag]
        if r.kind is not RegionKind.KV:
            raise ClientError(f"region {tag} is {r.kind}, not kv", ErrorCode.BAD_REQUEST)
        host, offload = self._kv_host, self.kv_offload_after_tokens
        if host is None or offload is None:  # no host tier: every block from HBM
            return TieredKvPool(
                r.address,
                r.size_bytes,
                block_bytes=block_bytes,
                tokens_per_block=tokens_per_block,
                offload_after_tokens=sys.maxsize,
                host_bytes=0,
            )
        return TieredKvPool(
            r.address,
            r.size_bytes,
            block_bytes=block_bytes,
            tokens_per_block=tokens_per_block,
            offload_after_tokens=offload,
            host_bytes=self.kv_host_bytes,
            host_address=host.address,
        )

    def _take_kv_host_tier(self, reply: Message) -> None:
        """Map the host-tier file the attach reply carries (writable), then close its fd."""
        doc = reply.body.get("kv_pool")
        if not doc:
            reply.close_fds()
            return
        fd = reply.fds[int(doc["fd"])]
        try:
            size = int(doc["host_bytes"])
            if self._kv_host is not None:
                self.mapper.unmap_host(self._kv_host)
                self._kv_host = None
            self._kv_host = self.mapper.map_host(fd, size, writable=True)
            self.kv_offload_after_tokens = int(doc["offload_after_tokens"])
            self.kv_host_bytes = size
        finally:
            reply.close_fds()

    def _drop_kv_host_tier(self) -> None:
        if self._kv_host is not None:
            self.mapper.unmap_host(self._kv_host)
            self._kv_host = None

    def commit(self) -> None:
        """Weights are loaded: the agent saves them to the host store, once."""
        reply = self._request(Op.COMMIT, {})
        self.committed = bool(reply.body.get("committed"))

    @contextlib.contextmanager
    def in_use(self, timeout_seconds: float | None = None) -> Iterator[None]:
        """Hold off swap-out while the body runs; swap the model in first if it is out."""
        deadline = time.monotonic() + (timeout_seconds or self.timeout_seconds)
        with self._cond:
            while True:
                if self._state is ClientState.REMOVED:
                    raise ClientError(f"{self.model} was removed", ErrorCode.REMOVED)
                if self._state is ClientState.RESIDENT and self._drain_token is None:
                    self._in_use += 1
                    break
                if self._state is ClientState.SWAPPED_OUT:
                    self._cond.release()
                    try:
                        self._request(Op.SWAP_IN, {}, deadline=deadline)
                    finally:
                        self._cond.acquire()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self.model}: not resident within the deadline")
                self._cond.wait(remaining)
        try:
            yield
        finally:
            with self._cond:
                self._in_use -= 1
                self._cond.notify_all()

    def _start_heartbeats(self) -> None:
        if self.heartbeat_interval_seconds > 0 and self._heartbeat_thread is None:
            self._heartbeat_thread = threading.Thread(
                target=self._heartbeats, name="modelswap-heartbeat", daemon=True
            )
            self._heartbeat_thread.start()

    def _heartbeats(self) -> None:
        """Tell the agent this process is alive, every `heartbeat_interval_seconds`.

        The agent records the last one per client (status) and logs a silent one; the
        socket closing, not a missed heartbeat, is what ends a client. A send that fails
        (the agent restarting) is simply skipped.
        """
        interval = self.heartbeat_interval_seconds
        while not self._heartbeat_stop.wait(interval):
            peer = self._peer
            if peer is None or not self._connected.is_set():
                continue
            try:
                peer.request(Op.HEARTBEAT, {}, self.epoch, timeout_seconds=interval)
            except (ConnectionLost, RemoteError, TimeoutError) as e:
                log.debug("%s: heartbeat not answered: %s", self.model, e)

    def close(self) -> None:
        """Detach: unmap everything, give the reservations back, close the connection."""
        with self._cond:
            self._closing = True
        self._heartbeat_stop.set()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=self.heartbeat_interval_seconds + 1)
        peer = self._peer
        if peer is not None:
            peer.close()
        with self._op_lock:
            self.mapper.synchronize()
            self._unmap_all()
            self._drop_weight_sources()
            self._drop_kv_host_tier()
            for r in self._reservations:
                self.mapper.free_reservation(r)
            self._reservations = []
            self.mapper.close()

    # -- requests to the agent -------------------------------------------------------------

    def _request(self, op: Op, body: dict[str, Any], deadline: float | None = None) -> Message:
        """Send a request; across an agent restart, wait for the reconnect and retry."""
        deadline = deadline or time.monotonic() + self.timeout_seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._connected.wait(remaining):
                raise TimeoutError(f"{self.model}: agent not reachable")
            peer = self._peer
            if peer is None:
                continue
            try:
                return peer.request(
                    op, body, self.epoch, timeout_seconds=max(deadline - time.monotonic(), 0.001)
                )
            except ConnectionLost:
                continue
            except RemoteError as e:
                raise ClientError(f"{self.model}: {op} refused: {e.message}", e.code) from e

    def _connect(self) -> Peer:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        peer = Peer(sock, self._handle, self._lost, name=f"{self.model}/{self.instance}")
        peer.start()
        reply = peer.request(
            Op.REGISTER,
            {"model": self.model, "instance": self.instance, "pid": os.getpid(), "version": 1},
            timeout_seconds=self.timeout_seconds,
        )
        self.epoch = max(self.epoch, reply.epoch)
        return peer

    # -- agent loss and readopt ------------------------------------------------------------

    def _lost(self, peer: Peer) -> None:
        with self._cond:
            if peer is not self._peer:
                return
            self._connected.clear()
            self._generation += 1
            self._cond.notify_all()
            if self._closing:
                return
        threading.Thread(target=self._recover, name="modelswap-reconnect", daemon=True).start()

    def _recover(self) -> None:
        with self._op_lock:  # waits for handlers still running for the dead agent
            with self._cond:
                state = self._state
            if state in (ClientState.DRAINING, ClientState.QUIESCED):
                self._set_state(ClientState.RESIDENT)  # the swap-out never finished: resume
            elif state is ClientState.MAPPED:
                self.mapper.synchronize()
                self._unmap_all()  # the restore never finished: back to swapped out
                self._set_state(ClientState.SWAPPED_OUT)
        deadline = time.monotonic() + self.reconnect_timeout_seconds
        delay = 0.02
        while not self._closing and time.monotonic() < deadline:
            try:
                peer = self._connect()
            except (OSError, ConnectionLost, RemoteError, TimeoutError):
                time.sleep(delay)  # the agent is restarting: retry with back-off
                delay = min(delay * 2, 0.5)
                continue
            try:
                self._readopt(peer)
            except (ConnectionLost, RemoteError, TimeoutError) as e:
                log.warning("%s: readopt failed: %s", self.model, e)
                peer.close()
                continue
            for h in self._on_readopt:
                h(self)
            return
        log.error(
            "%s: agent did not come back within %s s", self.model, self.reconnect_timeout_seconds
        )

    def _readopt(self, peer: Peer) -> None:
        with self._op_lock:
            state = self.state
            fds: list[int] = []
            regions = []
            mapped = state in (ClientState.RESIDENT,)
            for r in self.regions.values():
                chunks = []
                if mapped:
                    for offset, size, h in r.handles:
                        chunks.append({"offset": offset, "bytes": size, "fd": len(fds)})
                        fds.append(self.mapper.export_fd(h))
                regions.append(
                    {
                        "tag": r.tag,
                        "bytes": r.reserved_bytes,
                        "kind": str(r.kind),
                        "address": r.address,
                        "chunks": chunks,
                    }
                )
            wire_state = "resident" if mapped else "swapped_out"
            try:
                reply = peer.request(
                    Op.READOPT,
                    {"state": wire_state, "regions": regions},
                    self.epoch,
                    fds,
                    timeout_seconds=self.timeout_seconds,
                )
            finally:
                for fd in fds:
                    os.close(fd)
            with self._cond:
                self.epoch = max(self.epoch, reply.epoch)
                self.committed = bool(reply.body.get("committed", self.committed))
                self._peer = peer
                self._connected.set()
                self._cond.notify_all()

    # -- requests from the agent -----------------------------------------------------------

    def _set_state(self, state: ClientState) -> None:
        with self._cond:
            self._state = state
            if state is not ClientState.DRAINING and state is not ClientState.QUIESCED:
                self._drain_token = None
            self._cond.notify_all()

    def _handle(self, peer: Peer, message: Message) -> Message:
        if message.epoch < self.epoch and message.op is not Op.RESUME:
            message.close_fds()
            return error_reply(message, self.epoch, ErrorCode.STALE, "stale epoch")
        self.epoch = max(self.epoch, message.epoch)
        try:
            body: dict[str, Any] = {}
            if message.op is Op.QUIESCE:
                self._quiesce()
            elif message.op is Op.SAVE:
                with self._op_lock:
                    self._save(message)
            elif message.op is Op.UNMAP:
                with self._op_lock:
                    self.mapper.synchronize()
                    self._unmap_all()
                    self.kv_discarded = bool(message.body.get("kv_discarded"))
                    if message.body.get("dropped"):
                        self.dropped = True
                        self.restored = self.committed = False
                        self._drop_weight_sources()  # the host copies are deleted
                    self._set_state(ClientState.SWAPPED_OUT)
            elif message.op is Op.REMOVED:
                with self._op_lock:
                    self.mapper.synchronize()
                    self._unmap_all()
                    self._drop_weight_sources()
                    self._drop_kv_host_tier()  # its file is deleted: a KV pool over it is dead
                    with self._cond:
                        self._closing = True  # the agent closes the socket: no reconnect
                    self._heartbeat_stop.set()
                    self._set_state(ClientState.REMOVED)
            elif message.op is Op.MAP:
                with self._op_lock:
                    self._map(message)
                    self._set_state(ClientState.MAPPED)
            elif message.op is Op.RESTORE:
                with self._op_lock:
                    body = self._restore(message)
            elif message.op is Op.RESUME:
                with self._cond:
                    if self._state in (ClientState.DRAINING, ClientState.QUIESCED):
                        self._set_state(ClientState.RESIDENT)
            else:
                message.close_fds()
                return error_reply(message, self.epoch, ErrorCode.PROTOCOL, f"no {message.op}")
        except Exception as e:
            message.close_fds()
            log.warning("%s: %s failed: %s", self.model, message.op, e)
            return error_reply(message, self.epoch, ErrorCode.INTERNAL, f"{message.op}: {e}")
        return reply_to(message, self.epoch, body)

    def _quiesce(self) -> None:
        token = object()
        with self._cond:
            if self._state is not ClientState.RESIDENT:
                raise ClientError(f"cannot quiesce in state {self._state}", ErrorCode.WRONG_STATE)
            generation = self._generation
            self._drain_token = token
            self._state = ClientState.DRAINING
            self._cond.wait_for(
                lambda: (
                    self._in_use == 0
                    or self._drain_token is not token
                    or self._generation != generation
                )
            )
            if self._drain_token is not token or self._generation != generation:
                raise ClientError("swap-out was cancelled", ErrorCode.STALE)
        with self._op_lock:
            self.mapper.synchronize()
            for h in self._on_swap_out:
                h(self)
            self._set_state(ClientState.QUIESCED)
            with self._cond:
                self._drain_token = token

    def _pieces(self, start: int, size: int) -> Iterator[tuple[int, int]]:
        """(offset, bytes) pieces of [start, start + size), at most `copy_piece_bytes` each."""
        offset, end = start, start + size
        while offset < end:
            n = min(self.copy_piece_bytes, end - offset)
            yield offset, n
            offset += n

    def _save(self, message: Message) -> None:
        buffers = []
        events: list[CopyEvent] = []
        try:
            for rd in message.body["regions"]:
                r = self.regions[rd["tag"]]
                fd = message.fds[int(rd["fd"])]
                host = self.mapper.map_host(fd, int(rd["bytes"]), writable=True)
                buffers.append(host)
                for n, (off, size) in enumerate(self._pieces(0, r.reserved_bytes)):
                    events.append(
                        self.mapper.copy_to_host(
                            host.address + off,
                            r.address + off,
                            size,
                            n % self.mapper.stream_count(),
                        )
                    )
            for ev in events:
                ev.wait()
        finally:
            self.mapper.synchronize()
            for b in buffers:
                self.mapper.unmap_host(b)
            message.close_fds()  # the writable fds of host-store files never stay here

    def _map(self, message: Message) -> None:
        done: list[tuple[Region, int, int, Handle]] = []
        fds = list(message.fds)
        message.fds = []
        consumed: set[int] = set()
        try:
            for rd in message.body["regions"]:
                r = self.regions[rd["tag"]]
                if r.handles:
                    raise ClientError(f"region {r.tag} is already mapped", ErrorCode.WRONG_STATE)
                for c in rd["chunks"]:
                    index = int(c["fd"])
                    consumed.add(index)
                    h = self.mapper.import_fd(fds[index], int(c["bytes"]))
                    try:
                        self.mapper.map(r.address + int(c["offset"]), int(c["bytes"]), h)
                    except BaseException:
                        self.mapper.release(h)
                        raise
                    done.append((r, int(c["offset"]), int(c["bytes"]), h))
        except BaseException:
            for r, offset, size, h in done:
                self.mapper.unmap(r.address + offset, size)
                self.mapper.release(h)
            raise
        finally:
            for i, fd in enumerate(fds):
                if i not in consumed:
                    os.close(fd)
        for r, offset, size, h in done:
            r.handles.append((offset, size, h))

    def _weights_source(self, r: Region, fd: int, size_bytes: int) -> HostBuffer:
        """The read-only host mapping of `r`'s weight copy, kept between swap-ins.

        A weight copy is written once and never changes while its file exists, so the
        mapping made for the first restore serves every later one (a CUDA mapper pins
        host memory once this way); a different file (new inode) replaces it.
        """
        info = os.fstat(fd)
        key = (info.st_dev, info.st_ino, size_bytes)
        cached = self._weight_sources.get(r.tag)
        if cached is not None and cached[0] == key:
            return cached[1]
        if cached is not None:
            self.mapper.unmap_host(cached[1])
            del self._weight_sources[r.tag]
        host = self.mapper.map_host(fd, size_bytes, writable=False)
        self._weight_sources[r.tag] = (key, host)
        return host

    def _drop_weight_sources(self) -> None:
        for _, host in self._weight_sources.values():
            self.mapper.unmap_host(host)
        self._weight_sources.clear()

    def _restore(self, message: Message) -> dict[str, Any]:
        """Grant access chunk by chunk and copy each host copy in right behind it.

        Access is set per mapping (chunk) and that chunk's copies are queued at once, so
        the copy streams move chunk i while this thread grants access to chunk i+1 (for
        the sim mapper, granting access populates the page tables: the two overlap).
        """
        buffers = []
        events: list[CopyEvent] = []
        result: dict[str, str] = {}
        streams = self.mapper.stream_count()
        queued = 0
        copied_bytes = 0
        started = time.perf_counter()
        try:
            for rd in message.body["regions"]:
                r = self.regions[rd["tag"]]
                host: HostBuffer | None = None
                if rd.get("fresh"):
                    r.restored = False
                    result[r.tag] = "fresh"
                elif r.kind is RegionKind.WEIGHTS:
                    host = self._weights_source(r, message.fds[int(rd["fd"])], int(rd["bytes"]))
                else:  # a KV copy is rewritten by every swap-out: map it for this copy only
                    fd = message.fds[int(rd["fd"])]
                    host = self.mapper.map_host(fd, int(rd["bytes"]), writable=False)
                    buffers.append(host)
                for offset, size, _ in sorted(r.handles, key=lambda h: h[0]):
                    self.mapper.set_access(r.address + offset, size, writable=True)
                    if host is None:
                        continue
                    for off, n in self._pieces(offset, size):
                        events.append(
                            self.mapper.copy_to_device(
                                r.address + off, host.address + off, n, queued % streams
                            )
                        )
                        queued += 1
                        copied_bytes += n
                if host is not None:
                    r.restored = True
                    result[r.tag] = "restored"
                elif r.kind is RegionKind.WEIGHTS:  # reloaded after a drop or failure
                    self.restored = self.committed = False
            for ev in events:
                ev.wait()
            copy_seconds = time.perf_counter() - started
        finally:
            self.mapper.synchronize()
            for b in buffers:
                self.mapper.unmap_host(b)
            message.close_fds()
        paced = self.mapper.paced_bytes_per_second()
        # what this restore moved and how fast (granting access included); "scaled" when
        # the mapper paced it to an emulated link, so nobody reads it as a real link speed
        copy = {
            "bytes": copied_bytes,
            "seconds": copy_seconds,
            "scaled": paced > 0,
            "target_bytes_per_second": paced if paced > 0 else None,
        }
        was_out = self.state is ClientState.MAPPED
        self.dropped = False
        self._set_state(ClientState.RESIDENT)
        if was_out:
            for h in self._on_swap_in:
                h(self)
        return {"regions": result, "copy": copy}

    def _unmap_all(self) -> None:
        for r in self.regions.values():
            for offset, size, h in r.handles:
                self.mapper.unmap(r.address + offset, size)
                self.mapper.release(h)
            r.handles = []


def attach(
    model: str,
    regions: Sequence[RegionSpec],
    *,
    instance: str = "0",
    socket_path: str | None = None,
    mapper: str | Mapper = "sim",
    device: int | str | None = None,
    timeout_seconds: float = 60.0,
    reconnect_timeout_seconds: float = 60.0,
    copy_piece_bytes: int = DEFAULT_COPY_PIECE_BYTES,
    heartbeat_interval_seconds: float = 5.0,
) -> Attachment:
    """Register with the agent and get `regions` mapped at stable addresses.

    Each region is `restored` (its bytes came from the host store) or fresh (load it from
    the model source, then call `commit()`). Raises `ClientError` when the agent refuses
    (`NotVouched` for a process not vouched for as this model, `NoCapacity`, ...).
    `device` goes to a mapper built by name (`cuda-vmm`, `managed`): the GPU's UUID as the
    agent sends it (Triton parameter `modelswap.gpu_uuid`), resolved to this process's
    ordinal; None: the mapper's default (ordinal 0).
    """
    path = socket_path or os.environ.get(SOCKET_ENV)
    if not path:
        raise ClientError(f"no agent socket: pass socket_path or set {SOCKET_ENV}")
    options = {} if device is None else {"device": device}
    backend = mapper if isinstance(mapper, Mapper) else get_mapper(mapper, **options)
    att = Attachment(
        model,
        instance,
        path,
        backend,
        timeout_seconds=timeout_seconds,
        reconnect_timeout_seconds=reconnect_timeout_seconds,
        copy_piece_bytes=copy_piece_bytes,
        heartbeat_interval_seconds=heartbeat_interval_seconds,
    )
    try:
        for spec in regions:
            reserved = _round_up(spec.size_bytes)
            reservation = backend.reserve(reserved)
            att._reservations.append(reservation)
            att.regions[spec.tag] = Region(
                spec.tag,
                RegionKind(spec.kind),
                spec.size_bytes,
                reserved,
                reservation.address,
                on_device=backend.name != "sim",
                host_accessible=backend.name in ("sim", "managed"),
                device_ordinal=int(getattr(backend, "ordinal", 0)),
            )
        try:
            att._peer = att._connect()
        except RemoteError as e:
            raise ClientError(f"{model}: registration refused: {e.message}", e.code) from e
        att._connected.set()
        att._start_heartbeats()
        body = {
            "regions": [
                {"tag": r.tag, "bytes": r.reserved_bytes, "kind": str(r.kind), "address": r.address}
                for r in att.regions.values()
            ]
        }
        reply = att._request(Op.ATTACH, body)
        att._take_kv_host_tier(reply)
        att.restored = bool(reply.body.get("restored"))
        att.committed = att.restored
    except BaseException:
        att.close()
        raise
    return att
