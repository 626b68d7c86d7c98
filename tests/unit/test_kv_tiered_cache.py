"""`modelswap_client.kv_cache` without an agent: a transformers Cache over a TieredKvPool
(HBM tier: a CPU tensor standing in for the KV region; host tier: the pool's own memory)
gives exactly the greedy tokens of plain transformers, for Llama and GPT-2, through
`generate` and a hand-written decode loop, and never returns K/V whose bytes were lost."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from modelswap_client.errors import ClientError  # noqa: E402
from modelswap_client.kv_cache import (  # noqa: E402
    KvCacheLost,
    KvShape,
    PoolTensors,
    kv_shape_of,
)
from modelswap_client.kvpool import KvPoolFull, Tier, TieredKvPool  # noqa: E402

TOKENS_PER_BLOCK = 8
OFFLOAD_AFTER_TOKENS = 24
VOCAB = 256


def llama() -> Any:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def gpt2() -> Any:
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=256,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(1)
    return transformers.GPT2LMHeadModel(config).eval()


class Kv:
    """A pool and its tensors; the `generation` the cache checks is `self.generation`."""

    def __init__(self, model: Any, hbm_blocks: int = 16, host_blocks: int = 32) -> None:
        shape = kv_shape_of(model.config, tokens_per_block=TOKENS_PER_BLOCK)
        self.hbm = torch.zeros(hbm_blocks * shape.block_bytes, dtype=torch.uint8)
        self.pool = TieredKvPool(
            self.hbm.data_ptr(),
            self.hbm.numel(),
            block_bytes=shape.block_bytes,
            tokens_per_block=TOKENS_PER_BLOCK,
            offload_after_tokens=OFFLOAD_AFTER_TOKENS,
            host_bytes=host_blocks * shape.block_bytes,
        )
        self.generation = 0
        self.tensors = PoolTensors(self.pool, shape, self.hbm, generation=lambda: self.generation)


def prompt(n: int, seed: int = 3) -> Any:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (1, n), generator=g)


def plain(model: Any, ids: Any, new: int) -> Any:
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new, do_sample=False, min_new_tokens=new)


def pooled(model: Any, ids: Any, new: int, cache: Any) -> Any:
    with torch.no_grad():
        return model.generate(
            ids, cache=cache, max_new_tokens=new, do_sample=False, min_new_tokens=new
        )


@pytest.mark.parametrize("build", [llama, gpt2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("length", [10, 40], ids=["shorter", "longer"])
def test_generate_over_the_pool_equals_plain_transformers(build: Any, length: int) -> None:
    model = build()
    kv = Kv(model)
    ids = prompt(length)
    cache = kv.tensors.cache("s")
    out = pooled(model, ids, 12, cache)
    assert torch.equal(out, plain(model, ids, 12))
    assert cache.tokens == length + 12 - 1  # the last token's K/V is never computed
    tiers = [b.tier for b in kv.pool.blocks("s")]
    hbm = OFFLOAD_AFTER_TOKENS // TOKENS_PER_BLOCK
    assert tiers[:hbm] == [Tier.HBM] * min(hbm, len(tiers))
    assert tiers[hbm:] == [Tier.HOST] * (len(tiers) - hbm)
    # the K/V really are in the blocks: the first block holds layer 0's first key
    first = kv.tensors.block(kv.pool.blocks("s")[0])
    assert first.abs().sum() > 0
    if length > OFFLOAD_AFTER_TOKENS:  # and past offloadAfterTokens, in the host tier
        host_block = kv.tensors.block(kv.pool.blocks("s")[hbm])
        assert host_block.abs().sum() > 0


def test_a_follow_up_turn_reuses_the_cached_prefix() -> None:
    model = llama()
    kv = Kv(model)
    first = pooled(model, prompt(30), 8, cache := kv.tensors.cache("s"))
    held = cache.tokens
    follow = torch.cat([first, prompt(5, seed=9)], dim=1)
    calls: list[int] = []
    hook = model.model.layers[0].self_attn.register_forward_hook(
        lambda _m, _args, out: calls.append(int(out[0].shape[1]))
    )
    try:
        out = pooled(model, follow, 6, cache)
    finally:
        hook.remove()
    assert torch.equal(out, plain(model, follow, 6))
    # the prefill computed only the tokens past the cached prefix
    assert calls[0] == follow.shape[1] - held


def test_a_hand_written_decode_loop_matches_generate() -> None:
    model = llama()
    kv = Kv(model)
    ids = prompt(30)
    cache = kv.tensors.cache("loop")
    tokens = ids
    step = ids
    with torch.no_grad():
        for _ in range(10):
            logits = model(input_ids=step, cache=cache, use_cache=True).logits
            step = logits[:, -1:].argmax(-1)
            tokens = torch.cat([tokens, step], dim=1)
    assert torch.equal(tokens, plain(model, ids, 10))


def test_a_discarded_cache_raises_instead_of_reading_stale_kv_and_reset_recovers() -> None:
    model = llama()
    kv = Kv(model)
    ids = prompt(30)
    cache = kv.tensors.cache("s")
    out = pooled(model, ids, 4, cache)
    kv.generation += 1  # what a discard swap-out does to the attachment
    assert cache.lost
    with pytest.raises(KvCacheLost, match="discarded"):
        pooled(model, torch.cat([out, prompt(3)], dim=1), 4, cache)
    with pytest.raises(KvCacheLost):
        cache.get_seq_length()
    cache.reset()
    follow = torch.cat([out, prompt(3)], dim=1)
    assert torch.equal(pooled(model, follow, 4, cache), plain(model, follow, 4))


def test_host_blocks_taken_by_another_sequence_make_the_cache_lost() -> None:
    model = llama()
    kv = Kv(model, host_blocks=4)  # 32 host tokens
    a = kv.tensors.cache("a")
    pooled(model, prompt(40), 2, a)  # 24 HBM + 17 host tokens: 3 host blocks
    b = kv.tensors.cache("b")
    pooled(model, prompt(40, seed=5), 2, b)  # takes a's host blocks
    assert kv.pool.evicted == ["a"]
    with pytest.raises(KvCacheLost, match="host KV tier"):
        a.get_seq_length()
    assert not b.lost


def test_a_full_hbm_tier_names_the_setting() -> None:
    model = llama()
    kv = Kv(model, hbm_blocks=2)  # 16 HBM tokens though offloadAfterTokens is 24
    with pytest.raises(KvPoolFull, match="kvCacheBytes"):
        pooled(model, prompt(20), 2, kv.tensors.cache("s"))


def test_batches_and_beams_are_refused() -> None:
    model = llama()
    kv = Kv(model)
    with pytest.raises(ClientError, match="one sequence"):
        pooled(model, torch.cat([prompt(5), prompt(5, seed=4)]), 2, kv.tensors.cache("s"))


def test_crop_gives_blocks_back() -> None:
    model = llama()
    kv = Kv(model)
    cache = kv.tensors.cache("s")
    pooled(model, prompt(40), 2, cache)
    free = kv.pool.host_blocks_free
    cache.crop(-17)  # 41 → 24 tokens: the host blocks go back
    assert cache.tokens == 24 and kv.pool.tokens("s") == 24
    assert kv.pool.host_blocks_free == free + 3


def test_kv_shape_of_reads_llama_and_gpt2_configs() -> None:
    assert kv_shape_of(llama().config, tokens_per_block=8) == KvShape(2, 2, 8, "float32", 8)
    assert kv_shape_of(gpt2().config) == KvShape(2, 4, 8, "float32", 16)
    assert KvShape(2, 2, 8, "float32", 8).block_bytes == 2 * 2 * 2 * 8 * 4 * 8
    with pytest.raises(ClientError, match="KV shape"):
        kv_shape_of(object())


def test_pool_tensors_refuse_a_pool_of_another_block_size() -> None:
    model = llama()
    kv = Kv(model)
    other = KvShape(2, 2, 8, "float32", 16)
    with pytest.raises(ClientError, match="needs"):
        PoolTensors(kv.pool, other, kv.hbm)


class FakeRegion:
    def __init__(self, kind: str, size_bytes: int) -> None:
        self.kind, self.size_bytes = kind, size_bytes


class FakeAttachment:
    """Only what `for_attachment` reads before it asks for a pool."""

    def __init__(self, regions: dict[str, FakeRegion]) -> None:
        self.regions = regions

    def kv_pool(self, tag: str, **_: int) -> None:
        raise AssertionError("no pool may be built for a region that cannot hold one")


def test_for_attachment_names_a_missing_or_too_small_kv_region() -> None:
    from modelswap_client.kv_cache import for_attachment

    config = llama().config
    with pytest.raises(ClientError, match=r"no region 'kv' .*kvCacheBytes"):
        for_attachment(FakeAttachment({"weights": FakeRegion("weights", 1 << 20)}), config)  # type: ignore[arg-type]
    with pytest.raises(ClientError, match="less than one block"):
        for_attachment(FakeAttachment({"kv": FakeRegion("kv", 100)}), config)  # type: ignore[arg-type]
