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
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence

from modelswap_api.wire import ErrorCode, Message, Op, RegionKind, RemoteError
from modelswap_client import _libc
from modelswap_client._connecting import Connecting
from modelswap_client._state import ClientState
from modelswap_client.errors import ClientError
from modelswap_client.kvpool import TieredKvPool
from modelswap_client.mappers.base import Mapper, get_mapper
from modelswap_client.regions import Region, RegionSpec, round_up

__all__ = [
    "DEFAULT_COPY_PIECE_BYTES",
    "SOCKET_ENV",
    "Attachment",
    "ClientError",
    "ClientState",
    "Handler",
    "Region",
    "RegionSpec",
    "attach",
]

SOCKET_ENV = "MODELSWAP_SOCKET"
DEFAULT_COPY_PIECE_BYTES = 32 << 20

_libc.set_not_dumpable()
_libc.raise_fd_limit()

Handler = Callable[["Attachment"], None]


class Attachment(Connecting):
    """One model instance's regions and its connection to the agent.

    What it holds is `_state.AttachmentState`'s; the connection and recovery are
    `_connecting`'s, the swap handling `_swapping`'s, the copies `_copying`'s.
    """

    # -- public --------------------------------------------------------------------------

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
            reserved = round_up(spec.size_bytes)
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
