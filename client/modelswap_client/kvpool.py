"""A tiered KV-cache block pool: HBM blocks for short sequences, host blocks for long ones.

The HBM tier is a fixed KV region the agent maps (so the HBM budget never grows with
sequence length). A sequence's blocks come from HBM while it is at most
`offload_after_tokens` long; the blocks it needs beyond that come from the host tier,
which holds at most `host_bytes` (attached through the client library: an agent-owned
host-store file, counted in the host store's capacity). When the host tier is full, the
least recently used other sequence loses its host blocks (the caller sees it in `evicted`
and recomputes).
Every block says which tier it is in.
"""

from __future__ import annotations

import collections
import ctypes
import mmap
from dataclasses import dataclass, field

from modelswap_api.wire import StrEnum


class Tier(StrEnum):
    HBM = "hbm"
    HOST = "host"


class KvPoolFull(Exception):  # noqa: N818 - reads as the condition
    """No free block in the tier a sequence needs, and nothing left to evict."""


@dataclass(frozen=True, slots=True)
class Block:
    tier: Tier
    index: int
    address: int


@dataclass(slots=True)
class _Sequence:
    tokens: int = 0
    blocks: list[Block] = field(default_factory=list)


class TieredKvPool:
    def __init__(
        self,
        hbm_address: int,
        hbm_bytes: int,
        *,
        block_bytes: int,
        tokens_per_block: int,
        offload_after_tokens: int,
        host_bytes: int,
        host_address: int | None = None,
    ) -> None:
        """`host_address`: the host tier's memory (`host_bytes` of it; the client library
        passes its mapping of an agent-owned host-store file); None: anonymous memory of
        this process, for use without an agent."""
        if block_bytes <= 0 or tokens_per_block <= 0:
            raise ValueError("block_bytes and tokens_per_block must be positive")
        self.block_bytes = block_bytes
        self.tokens_per_block = tokens_per_block
        self.offload_after_tokens = offload_after_tokens
        self._hbm_address = hbm_address
        self.hbm_bytes = hbm_bytes
        self.hbm_blocks = hbm_bytes // block_bytes
        self._hbm_free = collections.deque(range(self.hbm_blocks))
        host_blocks = host_bytes // block_bytes
        self.host_blocks = host_blocks
        self._host_free = collections.deque(range(host_blocks))
        self._host_map: mmap.mmap | None = None
        if host_address is not None:
            self._host_base = host_address
        else:  # anonymous memory of this process
            self._host_map = mmap.mmap(-1, max(host_blocks * block_bytes, mmap.PAGESIZE))
            anchor = ctypes.c_char.from_buffer(self._host_map)
            self._host_base = ctypes.addressof(anchor)
            del anchor  # release the buffer export so close() can unmap
        self._sequences: collections.OrderedDict[str, _Sequence] = collections.OrderedDict()
        self.evicted: list[str] = []

    @property
    def hbm_blocks_free(self) -> int:
        return len(self._hbm_free)

    @property
    def host_blocks_free(self) -> int:
        return len(self._host_free)

    @property
    def hbm_address(self) -> int:
        """Where the HBM tier starts (block i lies at `hbm_address + i * block_bytes`)."""
        return self._hbm_address

    @property
    def host_address(self) -> int:
        """Where the host tier starts (`host_blocks * block_bytes` of it)."""
        return self._host_base

    def holds(self, seq_id: str) -> bool:
        return seq_id in self._sequences

    def tokens(self, seq_id: str) -> int:
        """Tokens a sequence has blocks for (0 for an unknown one); fewer than were
        appended once the host tier dropped its host blocks (see `evicted`)."""
        seq = self._sequences.get(seq_id)
        return 0 if seq is None else seq.tokens

    def truncate(self, seq_id: str, tokens: int) -> None:
        """Shrink a sequence to its first `tokens`, giving back the blocks past them."""
        seq = self._sequences.get(seq_id)
        if seq is None or tokens >= seq.tokens:
            return
        keep = -(-max(tokens, 0) // self.tokens_per_block)
        for b in seq.blocks[keep:]:
            (self._hbm_free if b.tier is Tier.HBM else self._host_free).append(b.index)
        del seq.blocks[keep:]
        seq.tokens = max(tokens, 0)

    def _host_address(self, index: int) -> int:
        return self._host_base + index * self.block_bytes

    def blocks(self, seq_id: str) -> list[Block]:
        return list(self._sequences[seq_id].blocks)

    def append_tokens(self, seq_id: str, tokens: int) -> list[Block]:
        """Grow a sequence by `tokens`; returns the blocks added (each with its tier)."""
        seq = self._sequences.setdefault(seq_id, _Sequence())
        self._sequences.move_to_end(seq_id)
        added: list[Block] = []
        target = seq.tokens + tokens
        while len(seq.blocks) * self.tokens_per_block < target:
            first_token = len(seq.blocks) * self.tokens_per_block
            if first_token >= self.offload_after_tokens:
                block = self._take_host(seq_id)
            else:
                if not self._hbm_free:
                    raise KvPoolFull("no free HBM KV block")
                i = self._hbm_free.popleft()
                block = Block(Tier.HBM, i, self._hbm_address + i * self.block_bytes)
            seq.blocks.append(block)
            added.append(block)
        seq.tokens = target
        return added

    def _take_host(self, seq_id: str) -> Block:
        while not self._host_free:
            victim = next(
                (
                    s
                    for s in self._sequences
                    if s != seq_id and any(b.tier is Tier.HOST for b in self._sequences[s].blocks)
                ),
                None,
            )
            if victim is None:
                raise KvPoolFull("host KV tier is full (hostBytes)")
            self._drop_host_blocks(victim)
        i = self._host_free.popleft()
        return Block(Tier.HOST, i, self._host_address(i))

    def _drop_host_blocks(self, seq_id: str) -> None:
        seq = self._sequences[seq_id]
        keep = [b for b in seq.blocks if b.tier is Tier.HBM]
        for b in seq.blocks:
            if b.tier is Tier.HOST:
                self._host_free.append(b.index)
        seq.blocks = keep
        seq.tokens = min(seq.tokens, len(keep) * self.tokens_per_block)
        self.evicted.append(seq_id)

    def touch(self, seq_id: str) -> None:
        self._sequences.move_to_end(seq_id)

    def free(self, seq_id: str) -> None:
        seq = self._sequences.pop(seq_id, None)
        if seq is None:
            return
        for b in seq.blocks:
            (self._hbm_free if b.tier is Tier.HBM else self._host_free).append(b.index)

    def close(self) -> None:
        self._sequences.clear()
        if self._host_map is not None:
            self._host_map.close()
