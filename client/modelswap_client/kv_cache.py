"""A transformers `Cache` whose K/V live in the tiered KV pool's blocks.

    from modelswap_client import kv_cache
    kv = kv_cache.for_attachment(att, model.config)          # over KV region "kv"
    with att.in_use():
        cache = kv.cache("conversation-1")
        out = model.generate(ids, past_key_values=cache, max_new_tokens=32)

Each pool block holds `tokens_per_block` tokens of every layer's keys and values
(`[layers, 2, kv_heads, tokens_per_block, head_dim]` of the model's dtype, batch 1). The
first `offloadAfterTokens` tokens of a sequence are in HBM-tier blocks, in the model's KV
region (`spec.model.kvCacheBytes`); later tokens in host-tier blocks, the agent's host-store
file (`kvCache.hostBytes`). `update` writes the new tokens into their blocks and hands
attention each layer's keys and values gathered from the blocks: HBM-tier blocks are read
where they are, host-tier blocks are staged (copied) to the model's device for the step.

Backends: on `sim` both tiers are host memory and the model runs on the CPU, so staging
is a gather into one tensor. On `cuda-vmm` and `managed` the HBM tier is device memory
(a DLPack view of the region, as `modelswap_client.torch` uses) and host-tier blocks are
copied host-to-device for each step; nothing reads the host tier in place over C2C yet.
Tested on sim (tests/unit, tests/integration) and on cuda-vmm with an H100
(tests/gpu/test_gpu_kv_cache.py); `managed` is untested.

A cache is valid only for the KV bytes it wrote: every read first checks the
attachment's `kv_generation` (a `discard` swap-out, a drop or a fresh KV region bumps it)
and that the pool still holds its blocks (a full host tier drops the least recently used
sequence's host blocks). A cache that fails either check raises `KvCacheLost` instead of
returning stale keys and values; `reset()` empties it so its tokens can be computed again
(`modelswap_client.kv_sessions` does that by itself). Use a cache inside `att.in_use()`:
outside it the region may be swapped out.

torch and transformers are imported at use: importing this module needs neither. The
cache needs transformers 5.24 or later (`REQUIRED_TRANSFORMERS`): 5.17 refuses
`generate(cache=...)` ("model_kwargs are not used") and 4.x ignores the keyword without a
word, so `PoolTensors.cache` checks the installed version and names it when it is older.
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

from modelswap_api.wire import ErrorCode
from modelswap_client.errors import ClientError
from modelswap_client.kvpool import Block, KvPoolFull, Tier, TieredKvPool

if TYPE_CHECKING:
    from modelswap_client.client import Attachment

__all__ = [
    "KvCacheLost",
    "KvShape",
    "REQUIRED_TRANSFORMERS",
    "PoolTensors",
    "for_attachment",
    "kv_shape_of",
    "require_transformers",
]

DEFAULT_TOKENS_PER_BLOCK = 16

#: grows a sequence in the pool by a number of tokens (`TieredKvPool.append_tokens`, or a
#: session store's version that evicts other sessions when a tier is full)
Grow = Callable[[str, int], object]


class KvCacheLost(ClientError):  # noqa: N818 - reads as the condition
    """The cache's bytes were discarded (swap-out with `kv: discard`, a drop) or its
    host-tier blocks were given to another sequence: its keys and values are not valid.
    `reset()` the cache and compute its tokens again."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ErrorCode.CONFLICT)


#: the oldest transformers whose `generate` passes `cache=` to the model (5.17 refuses the
#: keyword, 4.x drops it silently and keeps its own cache)
REQUIRED_TRANSFORMERS = (5, 24)


def require_transformers() -> None:
    """Raise a `ClientError` naming the installed transformers version when it is not
    `REQUIRED_TRANSFORMERS` or later (or not installed, or its version unreadable). Reads
    the package's metadata: transformers is not imported."""
    needed = ".".join(map(str, REQUIRED_TRANSFORMERS))
    try:
        found = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        raise ClientError(
            f"the KV cache needs transformers {needed} or later; it is not installed",
            ErrorCode.BAD_REQUEST,
        ) from None
    match = re.match(r"(\d+)\.(\d+)", found)
    if match is None or (int(match[1]), int(match[2])) < REQUIRED_TRANSFORMERS:
        raise ClientError(
            f"the KV cache needs transformers {needed} or later; found {found} "
            "(older versions refuse or silently ignore generate(cache=...))",
            ErrorCode.BAD_REQUEST,
        )


def _torch() -> Any:
    from modelswap_client.torch import _torch as load  # noqa: PLC0415 - one import message

    return load()


@dataclass(frozen=True, slots=True)
class KvShape:
    """What one token's K/V is for a model: per layer, `kv_heads` x `head_dim` of `dtype`,
    once for keys and once for values."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "float32"  # torch's name
    tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK

    @property
    def itemsize(self) -> int:
        return int(getattr(_torch(), self.dtype).itemsize)

    @property
    def block_bytes(self) -> int:
        """Bytes of one pool block: every layer's K and V for `tokens_per_block` tokens."""
        per_token = self.layers * 2 * self.kv_heads * self.head_dim * self.itemsize
        return per_token * self.tokens_per_block

    def bytes_for(self, tokens: int) -> int:
        """Pool bytes a sequence of `tokens` occupies (whole blocks)."""
        return -(-tokens // self.tokens_per_block) * self.block_bytes


def kv_shape_of(
    config: Any, *, dtype: str | None = None, tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK
) -> KvShape:
    """The K/V shape of a transformers config: Llama-style (`num_key_value_heads`,
    `head_dim`) or GPT-2-style (`n_layer`, `n_head`, `n_embd`)."""
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if not (layers and heads and hidden):
        raise ClientError(
            f"cannot tell the KV shape of a {type(config).__name__}: it needs layers, "
            "attention heads and a hidden size",
            ErrorCode.BAD_REQUEST,
        )
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    if dtype is None:
        found = getattr(config, "dtype", None)
        dtype = str(found).removeprefix("torch.") if found is not None else "float32"
    return KvShape(int(layers), int(kv_heads), int(head_dim), dtype, tokens_per_block)


class PoolTensors:
    """A `TieredKvPool` with a torch view of each block. `hbm` is a uint8 tensor over the
    HBM tier (the KV region's `torch()` view: CPU on sim, CUDA on GPU backends); the host
    tier is viewed as CPU memory at the pool's `host_address`. `generation` reads the
    attachment's `kv_generation` (0 forever without an agent)."""

    def __init__(
        self,
        pool: TieredKvPool,
        shape: KvShape,
        hbm: Any,
        *,
        generation: Callable[[], int] = lambda: 0,
    ) -> None:
        if pool.block_bytes != shape.block_bytes:
            raise ClientError(
                f"the pool's blocks are {pool.block_bytes} bytes; this K/V shape needs "
                f"{shape.block_bytes}",
                ErrorCode.BAD_REQUEST,
            )
        torch = _torch()
        self.pool = pool
        self.shape = shape
        self.generation = generation
        self.device = hbm.device
        self._dtype = getattr(torch, shape.dtype)
        self._hbm = hbm
        host_bytes = pool.host_blocks * pool.block_bytes
        self._host = None
        if host_bytes:
            raw = (ctypes.c_char * host_bytes).from_address(pool.host_address)
            self._host = torch.frombuffer(memoryview(raw).cast("B"), dtype=torch.uint8)
        self._block_shape = (
            shape.layers,
            2,
            shape.kv_heads,
            shape.tokens_per_block,
            shape.head_dim,
        )

    def block(self, block: Block) -> Any:
        """The block's tensor, `[layers, 2, kv_heads, tokens_per_block, head_dim]`, no copy
        (on the HBM tier's device, or CPU for the host tier)."""
        size = self.pool.block_bytes
        if block.tier is Tier.HBM:
            base, start = self._hbm, block.address - self.pool.hbm_address
        else:
            base, start = self._host, block.address - self.pool.host_address
        return base[start : start + size].view(self._dtype).view(self._block_shape)

    def cache(self, seq_id: str, *, grow: Grow | None = None) -> Any:
        """A transformers `Cache` for sequence `seq_id` of the pool (batch 1), empty unless
        the pool holds the sequence already, which it then drops (a new cache cannot know
        what those blocks hold). Raises a `ClientError` when the installed transformers is
        older than `REQUIRED_TRANSFORMERS`."""
        require_transformers()
        self.pool.free(seq_id)
        return _cache_class()(self, seq_id, grow or grow_or_raise(self.pool))


def for_attachment(
    att: Attachment,
    config: Any,
    tag: str = "kv",
    *,
    dtype: str | None = None,
    tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK,
) -> PoolTensors:
    """The tiered pool over KV region `tag` of `att` (`Attachment.kv_pool`), sized for
    `config`'s K/V, with torch views of its blocks and the attachment's `kv_generation`.
    Build one per region and keep it: two pools over one region hand out the same blocks."""
    shape = kv_shape_of(config, dtype=dtype, tokens_per_block=tokens_per_block)
    if tag not in att.regions:
        raise ClientError(
            f"no region {tag!r} in this attachment (it has {sorted(att.regions)}): "
            "set spec.model.kvCacheBytes and attach a kv region",
            ErrorCode.BAD_REQUEST,
        )
    region = att.regions[tag]
    if region.size_bytes < shape.block_bytes:
        raise ClientError(
            f"KV region {tag!r} holds {region.size_bytes} bytes, less than one block of "
            f"{shape.block_bytes} ({tokens_per_block} tokens of this model's K/V)",
            ErrorCode.BAD_REQUEST,
        )
    pool = att.kv_pool(tag, block_bytes=shape.block_bytes, tokens_per_block=tokens_per_block)
    return PoolTensors(pool, shape, region.torch(), generation=lambda: att.kv_generation)


@functools.cache
def _cache_class() -> type:
    """`TieredKvCache`, a subclass of transformers' `Cache`, built at first use so this
    module imports without transformers."""
    from transformers.cache_utils import (  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
        Cache,
        CacheLayerMixin,
    )

    torch = _torch()

    class PoolLayer(CacheLayerMixin):  # type: ignore[misc,valid-type,no-untyped-call,unused-ignore]
        """One layer's view of the cache (what transformers' `Cache` lists)."""

        is_sliding = False
        is_compileable = False
        is_croppable = True

        def __init__(self, owner: Any, index: int) -> None:
            super().__init__()  # type: ignore[no-untyped-call,unused-ignore]
            self._owner = owner
            self._index = index
            self.is_initialized = True

        def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
            del key_states, value_states

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            return self._owner.update(key_states, value_states, self._index)

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self._owner.layer_tokens(self._index) + query_length, 0

        def get_seq_length(self) -> int:
            return int(self._owner.layer_tokens(self._index))

        def get_max_length(self) -> int:
            return -1

        def reset(self) -> None:
            self._owner.reset()

        def crop(self, tokens_to_remove: int) -> None:
            self._owner.crop(tokens_to_remove)

    class TieredKvCache(Cache):  # type: ignore[misc,valid-type,unused-ignore]
        """K/V of one sequence (batch 1) in the pool's blocks; see the module docstring."""

        def __init__(self, tensors: PoolTensors, seq_id: str, grow: Grow) -> None:
            self.tensors = tensors
            self.seq_id = seq_id
            self._grow = grow
            self.generation = tensors.generation()
            layers = tensors.shape.layers
            self._tokens = [0] * layers
            super().__init__(layers=[PoolLayer(self, i) for i in range(layers)])

        # -- what it holds --------------------------------------------------------------

        @property
        def tokens(self) -> int:
            """Tokens every layer holds (the sequence length attention sees next)."""
            return min(self._tokens)

        def lost_reason(self) -> str:
            """Why the cache's bytes are not valid any more; "" while they are."""
            held = max(self._tokens)
            if self.generation != self.tensors.generation():
                return "the KV cache was discarded by a swap-out (kv: discard, or a drop)"
            if held and self.tensors.pool.tokens(self.seq_id) < held:
                return "the host KV tier gave this sequence's blocks to another one"
            return ""

        @property
        def lost(self) -> bool:
            return bool(self.lost_reason())

        def check(self) -> None:
            """Raise `KvCacheLost` when the cache's bytes are not valid any more."""
            why = self.lost_reason()
            if why:
                raise KvCacheLost(f"sequence {self.seq_id}: {why}; reset() and recompute")

        def layer_tokens(self, index: int) -> int:
            self.check()
            return self._tokens[index]

        # -- transformers' Cache ---------------------------------------------------------

        def update(
            self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any
        ) -> tuple[Any, Any]:
            """Write the new tokens' K/V (`[1, kv_heads, n, head_dim]`) into their blocks and
            return the layer's K/V for every token so far, staged on the model's device."""
            self.check()
            if key_states.shape[0] != 1:
                raise ClientError(
                    f"a pool KV cache holds one sequence; got a batch of {key_states.shape[0]}",
                    ErrorCode.BAD_REQUEST,
                )
            start = self._tokens[layer_idx]
            end = start + key_states.shape[-2]
            pool = self.tensors.pool
            held = pool.tokens(self.seq_id)
            if end > held:
                self._grow(self.seq_id, end - held)
            blocks = pool.blocks(self.seq_id)
            per_block = self.tensors.shape.tokens_per_block
            position = start
            while position < end:
                i, offset = divmod(position, per_block)
                n = min(per_block - offset, end - position)
                view = self.tensors.block(blocks[i])
                src = position - start
                kv = (key_states, value_states)
                for which in (0, 1):
                    view[layer_idx, which, :, offset : offset + n, :].copy_(
                        kv[which][0, :, src : src + n, :]
                    )
                position += n
            self._tokens[layer_idx] = end
            return self._gather(layer_idx, end, blocks)

        def _gather(self, layer_idx: int, tokens: int, blocks: list[Block]) -> tuple[Any, Any]:
            device = self.tensors.device
            used = blocks[: -(-tokens // self.tensors.shape.tokens_per_block)]
            views = [self.tensors.block(b)[layer_idx] for b in used]
            # host-tier blocks are staged to the device (a no-op copy-free view on sim)
            parts = [v.to(device, non_blocking=True) for v in views]
            both = torch.cat(parts, dim=2)[:, :, :tokens, :]  # [2, heads, tokens, dim]
            return both[0].unsqueeze(0), both[1].unsqueeze(0)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return self.layer_tokens(layer_idx)

        def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
            return self.layer_tokens(layer_idx) + query_length, 0

        def get_max_length(self, layer_idx: int | None = None) -> int:
            return -1

        def crop(self, tokens_to_remove: int) -> None:
            """Keep the first tokens: a negative `tokens_to_remove` drops that many from
            the end (transformers' convention), a positive one is the length to keep."""
            keep = self.tokens + tokens_to_remove if tokens_to_remove < 0 else tokens_to_remove
            keep = max(0, min(keep, self.tokens))
            self._tokens = [keep] * len(self._tokens)
            self.tensors.pool.truncate(self.seq_id, keep)

        def reset(self) -> None:
            """Empty the cache and give its blocks back; it is valid again (at the
            attachment's current `kv_generation`)."""
            self.tensors.pool.free(self.seq_id)
            self._tokens = [0] * len(self._tokens)
            self.generation = self.tensors.generation()

        def free(self) -> None:
            """Give the cache's blocks back to the pool (the cache is empty after)."""
            self.reset()

        def _one_sequence(self, what: str) -> None:
            raise ClientError(
                f"a pool KV cache holds one sequence: {what} is not supported "
                "(num_beams and num_return_sequences must be 1)",
                ErrorCode.BAD_REQUEST,
            )

        def reorder_cache(self, beam_idx: Any) -> None:
            self._one_sequence("beam search")

        def batch_repeat_interleave(self, repeats: int) -> None:
            if repeats != 1:
                self._one_sequence("repeating the batch")

        def batch_select_indices(self, indices: Any) -> None:
            self._one_sequence("selecting batch rows")

        @property
        def batch_size(self) -> int:
            return 1

    return TieredKvCache


def grow_or_raise(pool: TieredKvPool) -> Grow:
    """`pool.append_tokens`, with a message that says which setting to raise when a tier
    is full (what a cache without a session store uses)."""

    def grow(seq_id: str, tokens: int) -> object:
        try:
            return pool.append_tokens(seq_id, tokens)
        except KvPoolFull as e:
            raise KvPoolFull(
                f"{e}: raise spec.model.kvCacheBytes or kvCache.hostBytes, or end sequences"
            ) from e

    return grow
