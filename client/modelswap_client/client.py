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

`Attachment` is a facade over small parts that take their collaborators in their
constructors, wired once by `attach()`: the state gate (`_gate`: client state and the
in-use gate), the regions (`regions.Regions`: reservations and `Region` records), the
copier (`_copier`: save, map, restore), the KV host tier (`_kvhost`), the agent handler
(`_handler`: the agent's requests, rollback and readopt) and the agent link (`_link`:
connection, requests, heartbeats, reconnect). What the mapper can do (`on_device`,
`host_accessible`, `device_ordinal`) it says itself.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator, Sequence

from modelswap_api.wire import Op
from modelswap_client import _libc
from modelswap_client._copier import Copier
from modelswap_client._facts import AgentFacts
from modelswap_client._gate import ClientState, StateGate
from modelswap_client._handler import AgentHandler
from modelswap_client._hooks import Hooks
from modelswap_client._kvhost import KvHostTier
from modelswap_client._link import AgentLink
from modelswap_client.errors import ClientError
from modelswap_client.kvpool import TieredKvPool
from modelswap_client.mappers.base import Mapper, get_mapper
from modelswap_client.regions import Region, Regions, RegionSpec

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


class Attachment:
    """One model instance's regions and its connection to the agent (built by `attach`)."""

    def __init__(
        self,
        model: str,
        instance: str,
        mapper: Mapper,
        *,
        gate: StateGate,
        facts: AgentFacts,
        regions: Regions,
        kv_host: KvHostTier,
        handler: AgentHandler,
        link: AgentLink,
        hooks: Hooks,
        timeout_seconds: float,
    ) -> None:
        self.model = model
        self.instance = instance
        self.mapper = mapper
        self.timeout_seconds = timeout_seconds
        self._gate = gate
        self._facts = facts
        self._regions = regions
        self._kv_host = kv_host
        self._handler = handler
        self._link = link
        self._hooks = hooks

    # -- what it is ------------------------------------------------------------------------

    @property
    def state(self) -> ClientState:
        return self._gate.state

    @property
    def regions(self) -> dict[str, Region]:
        """Tag → region, as asked for in `attach`."""
        return self._regions.by_tag

    @property
    def restored(self) -> bool:
        """The regions' bytes came from the host store: no load from the model source."""
        return self._facts.restored

    @property
    def committed(self) -> bool:
        """The weights are saved in the host store (`commit`)."""
        return self._facts.committed

    @property
    def dropped(self) -> bool:
        """The last swap-out dropped the model: the next swap-in maps fresh memory and the
        runtime reloads from the source (see `restored`)."""
        return self._facts.dropped

    @property
    def kv_discarded(self) -> bool:
        """The last swap-out discarded the KV cache."""
        return self._facts.kv_discarded

    @property
    def kv_generation(self) -> int:
        """Counts the times the KV regions' bytes were lost (a `discard` swap-out, a drop,
        a KV region mapped fresh): K/V written at an older count is not valid any more
        (`modelswap_client.kv_cache` checks it before every read)."""
        return self._facts.kv_generation

    @property
    def epoch(self) -> int:
        return self._facts.epoch

    @property
    def kv_offload_after_tokens(self) -> int | None:
        """The KV policy's `offloadAfterTokens` (None: no host tier)."""
        return self._kv_host.offload_after_tokens

    @property
    def kv_host_bytes(self) -> int:
        return self._kv_host.host_bytes

    # -- what it does ----------------------------------------------------------------------

    def on_swap_out(self, handler: Handler) -> None:
        """Run after in-flight work drained, before the memory is unmapped."""
        self._hooks.swap_out.append(functools.partial(handler, self))

    def on_swap_in(self, handler: Handler) -> None:
        """Run after a swap-in restored every region."""
        self._hooks.swap_in.append(functools.partial(handler, self))

    def on_readopt(self, handler: Handler) -> None:
        """Run after reconnecting to a restarted agent."""
        self._hooks.readopt.append(functools.partial(handler, self))

    def kv_pool(self, tag: str, *, block_bytes: int, tokens_per_block: int) -> TieredKvPool:
        """A tiered KV pool over KV region `tag` (the HBM tier), configured by the model's
        policy: sequences longer than `offloadAfterTokens` get blocks from the host tier,
        `hostBytes` of an agent-owned host-store file (LRU when full). Without a host tier
        in the policy, every block comes from HBM."""
        return self._kv_host.pool(
            self._regions[tag], block_bytes=block_bytes, tokens_per_block=tokens_per_block
        )

    def report_kv(self, report: Callable[[], dict[str, int]] | None) -> None:
        """Send `report()` with every heartbeat (`KvSessionStore.report`: KV blocks by
        tier, sessions, hits, misses, evictions, tokens reused and recomputed); the agent
        keeps the last one per instance and exports it as `modelswap_kv_*` metrics. None
        stops it."""
        self._link.kv_report = report

    @property
    def fingerprint(self) -> str:
        """What the committed weights are, as given to `commit` ("" when not committed or
        committed without one). A restored attachment reports the fingerprint its host
        copy was committed with, so a model whose layout changed can tell."""
        return self._facts.fingerprint

    def commit(self, fingerprint: str = "", *, replace: bool = False) -> None:
        """Weights are loaded: the agent saves them to the host store, once, with
        `fingerprint` (at most 4,096 characters). `replace`: save again over a committed
        copy — for a model that found its restored bytes stale and loaded afresh; call it
        inside `in_use()` so no swap-out comes between the load and the save."""
        body: dict[str, object] = {"fingerprint": fingerprint}
        if replace:
            body["replace"] = True
        reply = self._link.request(Op.COMMIT, body)
        self._facts.committed = bool(reply.body.get("committed"))
        if self._facts.committed:
            self._facts.fingerprint = fingerprint

    @contextlib.contextmanager
    def in_use(self, timeout_seconds: float | None = None) -> Iterator[None]:
        """Hold off swap-out while the body runs; swap the model in first if it is out."""
        deadline = time.monotonic() + (timeout_seconds or self.timeout_seconds)
        self._gate.enter(deadline, self._swap_in)
        try:
            yield
        finally:
            self._gate.leave()

    def allocations(self, tag: str = "weights") -> contextlib.AbstractContextManager[object]:
        """Inside it, this thread's torch CUDA allocations land in region `tag` (a torch
        MemPool over the region; GPU backends only), so unmodified loading code pages:
        `with att.allocations(): model = AutoModel.from_pretrained(path).cuda()`, then
        `commit()`. Holds the model resident for the body; yields the pool (its `stats()`).
        See `modelswap_client.allocation`."""
        if not self.mapper.on_device:
            raise ClientError(
                "the allocation route needs a GPU backend (cuda-vmm or managed); this "
                "attachment's memory is host memory (sim): use modelswap_client.torch.adopt"
            )
        from modelswap_client import allocation  # noqa: PLC0415 - torch and the shim at use

        return allocation.allocations(self, tag)

    def _swap_in(self, deadline: float) -> None:
        self._link.request(Op.SWAP_IN, {}, deadline=deadline)

    def close(self) -> None:
        """Detach: close the connection, unmap everything, give the reservations back."""
        self._gate.close()
        self._link.close()
        self._handler.release()
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
    gate, facts, hooks = StateGate(model), AgentFacts(), Hooks()
    reserved = Regions(backend)
    kv_host = KvHostTier(backend)
    copier = Copier(backend, reserved, copy_piece_bytes)
    handler = AgentHandler(
        model,
        backend,
        gate=gate,
        facts=facts,
        regions=reserved,
        copier=copier,
        kv_host=kv_host,
        hooks=hooks,
    )
    link = AgentLink(
        path,
        model,
        instance,
        handler=handler,
        gate=gate,
        facts=facts,
        hooks=hooks,
        timeout_seconds=timeout_seconds,
        reconnect_timeout_seconds=reconnect_timeout_seconds,
        heartbeat_interval_seconds=heartbeat_interval_seconds,
    )
    att = Attachment(
        model,
        instance,
        backend,
        gate=gate,
        facts=facts,
        regions=reserved,
        kv_host=kv_host,
        handler=handler,
        link=link,
        hooks=hooks,
        timeout_seconds=timeout_seconds,
    )
    try:
        reserved.reserve(regions)
        link.open()
        # the agent maps and restores the regions (MAP, RESTORE through the handler)
        # before it answers
        reply = link.request(Op.ATTACH, {"regions": reserved.layout()})
        kv_host.take(reply)
        facts.restored = facts.committed = bool(reply.body.get("restored"))
        facts.fingerprint = str(reply.body.get("fingerprint", "")) if facts.restored else ""
    except BaseException:
        att.close()
        raise
    return att
