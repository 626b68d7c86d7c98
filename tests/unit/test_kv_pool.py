from __future__ import annotations

import ctypes

import pytest

from modelswap_client.kvpool import KvPoolFull, Tier, TieredKvPool

BLOCK = 4096


def pool(hbm_blocks: int = 8, host_blocks: int = 4, offload: int = 64) -> TieredKvPool:
    buf = ctypes.create_string_buffer(hbm_blocks * BLOCK)
    p = TieredKvPool(
        ctypes.addressof(buf),
        hbm_blocks * BLOCK,
        block_bytes=BLOCK,
        tokens_per_block=16,
        offload_after_tokens=offload,
        host_bytes=host_blocks * BLOCK,
    )
    p._keep = buf  # type: ignore[attr-defined]  # the HBM stand-in lives as long as the pool
    return p


def test_short_sequences_use_hbm_long_ones_spill_to_host() -> None:
    p = pool()
    short = p.append_tokens("s", 40)
    assert [b.tier for b in short] == [Tier.HBM] * 3
    long = p.append_tokens("l", 128)  # 8 blocks: the first 4 (64 tokens) in HBM
    assert [b.tier for b in long] == [Tier.HBM] * 4 + [Tier.HOST] * 4
    assert p.hbm_blocks_free == 1  # the HBM budget holds: long sequences do not take more
    ctypes.memset(long[-1].address, 1, BLOCK)  # host blocks are real memory
    p.close()


def test_host_tier_is_lru_capped_by_host_bytes() -> None:
    p = pool(hbm_blocks=16, host_blocks=4, offload=16)
    p.append_tokens("old", 48)  # 1 HBM + 2 host blocks
    p.append_tokens("new", 48)  # needs 2 host blocks: only 2 free
    p.append_tokens("newer", 32)  # 1 HBM + 1 host block: evicts the LRU, "old"
    assert p.evicted == ["old"]
    assert [b.tier for b in p.blocks("old")] == [Tier.HBM]
    assert p.host_blocks_free == 1
    p.free("new")
    assert p.host_blocks_free == 3
    p.close()


def test_hbm_exhaustion_is_an_error_not_an_overcommit() -> None:
    p = pool(hbm_blocks=2, offload=10_000)
    p.append_tokens("a", 32)
    with pytest.raises(KvPoolFull):
        p.append_tokens("b", 1)
    p.close()
