"""The pool KV cache and its session store across real swaps (an engine process on the sim
backend; the model process is this test process, vouched for by pid): with `kv: preserve`
a conversation continued after a swap-out/swap-in gives the tokens of an uninterrupted
run with no prefix token computed again; with `discard`, a cache written before the
swap-out raises instead of reading the region's fresh bytes, and the session store
computes the prefix again from its token ids, counted, with the same tokens."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from modelswap_client import kv_cache  # noqa: E402
from modelswap_client import torch as mstorch  # noqa: E402
from modelswap_client.client import Attachment, RegionSpec, attach  # noqa: E402
from modelswap_client.kv_sessions import KvSessionStore  # noqa: E402
from modelswap_client.kvpool import Tier  # noqa: E402
from tests.support.engine_procs import AgentProc, shm_procs  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402

MIB = 1 << 20
MODEL = "m"
OFFLOAD_AFTER_TOKENS = 32
NEW = 8
VOCAB = 256
SHORT, LONG = 12, 60  # prompts shorter and longer than offloadAfterTokens


def agent_for(mode: str) -> Any:
    @pytest.fixture
    def agent() -> Iterator[AgentProc]:
        with shm_procs("modelswap-kvswap-") as procs:
            a = procs.agent(
                ["128M"],
                [f"{MODEL}:0:{mode}"],
                ["--kv-tier", f"{MODEL}:{OFFLOAD_AFTER_TOKENS}:512K"],
            )
            a.ok(cmd="vouch", pid=os.getpid(), model=MODEL)
            yield a

    return agent


preserving = agent_for("preserve")
discarding = agent_for("discard")


def build() -> Any:
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


def prompt(n: int, seed: int) -> Any:
    return torch.randint(1, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def plain(model: Any, ids: Any) -> Any:
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)


class World:
    def __init__(self, agent: AgentProc) -> None:
        self.agent = agent
        self.reference = build()  # plain transformers, never in a region
        self.att: Attachment = attach(
            MODEL,
            [RegionSpec("weights", 4 * MIB), RegionSpec("kv", 1 * MIB, "kv")],
            socket_path=agent.socket,
            heartbeat_interval_seconds=0.1,  # the KV report rides the heartbeats
        )
        self.model = build()
        mstorch.adopt(self.att, self.model)  # the weights swap too
        self.kv = kv_cache.for_attachment(self.att, self.model.config)
        self.store = KvSessionStore(
            self.kv, namespace="ns", model=MODEL, max_sessions=4, hold=self.att.in_use
        )
        self.att.report_kv(self.store.report)

    def chat(self, sid: str, ids: Any) -> tuple[Any, Any]:
        with self.store.turn(sid, ids, self.model) as turn:
            with torch.no_grad():
                out = self.model.generate(
                    ids, cache=turn.cache, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False
                )
            turn.keep(out)
        return out, turn

    def agent_kv(self) -> dict[str, int]:
        doc: dict[str, int] = self.agent.status()["models"][MODEL]["kv"]
        return doc

    def swap_out(self) -> None:
        self.agent.ok(cmd="swap_out", model=MODEL)

    def close(self) -> None:
        self.att.close()


@pytest.fixture
def preserve_world(preserving: AgentProc) -> Iterator[World]:
    w = World(preserving)
    yield w
    w.close()


@pytest.fixture
def discard_world(discarding: AgentProc) -> Iterator[World]:
    w = World(discarding)
    yield w
    w.close()


def _in_region(att: Attachment, address: int) -> bool:
    r = att.regions["kv"]
    return r.address <= address < r.address + r.size_bytes


def test_preserve_continues_after_a_swap_with_the_same_tokens_and_no_recompute(
    preserve_world: World,
) -> None:
    w = preserve_world
    assert w.att.kv_offload_after_tokens == OFFLOAD_AFTER_TOKENS
    for sid, length in (("short", SHORT), ("long", LONG)):
        first, _ = w.chat(sid, prompt(length, seed=length))
        assert torch.equal(first, plain(w.reference, prompt(length, seed=length)))
        blocks = w.kv.pool.blocks(sid)
        hbm = [b for b in blocks if b.tier is Tier.HBM]
        assert all(_in_region(w.att, b.address) for b in hbm)
        if length > OFFLOAD_AFTER_TOKENS:  # past offloadAfterTokens: the host tier
            assert len(hbm) == OFFLOAD_AFTER_TOKENS // w.kv.shape.tokens_per_block
            assert any(b.tier is Tier.HOST for b in blocks)
        else:
            assert len(hbm) == len(blocks)
        generation = w.att.kv_generation
        w.swap_out()
        assert w.att.state.value != "resident"
        follow = torch.cat([first, prompt(5, seed=length + 1)], dim=1)
        out, turn = w.chat(sid, follow)  # swaps in first
        assert torch.equal(out, plain(w.reference, follow))
        assert turn.reused_tokens == first.shape[1] - 1 and turn.recomputed_tokens == 0
        assert w.att.kv_generation == generation
    stats = w.store.stats()
    assert stats.tokens_recomputed == 0 and stats.hits == 2 and stats.misses == 2
    # the agent has what the store counted (its heartbeats carry it)
    want = stats.as_doc()
    kv = wait_for(
        lambda: w.agent_kv() == want and w.agent_kv(),
        what=f"the agent's kv report to read {want}",
    )
    assert kv["tokens_reused"] > 0 and kv["device_blocks"] == stats.device_blocks


def test_discard_recomputes_from_token_ids_and_never_reads_stale_kv(
    discard_world: World,
) -> None:
    w = discard_world
    recomputed = 0
    for sid, length in (("short", SHORT), ("long", LONG)):
        first, _ = w.chat(sid, prompt(length, seed=length))
        direct = w.kv.cache(f"direct-{sid}")  # a cache outside the store, same prefix
        with w.att.in_use(), torch.no_grad():
            w.model(input_ids=first, cache=direct, use_cache=True)
        generation = w.att.kv_generation
        w.swap_out()
        with w.att.in_use():
            assert w.att.kv_generation > generation  # the discard (and the fresh region)
            # the region came back fresh: what the HBM blocks held is gone
            hbm = [b for b in w.kv.pool.blocks(sid) if b.tier is Tier.HBM]
            assert all(not w.kv.block(b).any() for b in hbm)
            with pytest.raises(kv_cache.KvCacheLost, match="discarded"):
                direct.get_seq_length()
            with pytest.raises(kv_cache.KvCacheLost), torch.no_grad():
                w.model(input_ids=prompt(1, seed=1), cache=direct, use_cache=True)
            direct.reset()  # usable again, empty
            assert direct.get_seq_length() == 0
            direct.free()
        follow = torch.cat([first, prompt(5, seed=length + 1)], dim=1)
        out, turn = w.chat(sid, follow)
        assert torch.equal(out, plain(w.reference, follow))
        assert turn.reused_tokens == 0 and turn.recomputed_tokens == first.shape[1] - 1
        recomputed += turn.recomputed_tokens
        # the turn after that reuses again: the recomputed prefix is valid K/V
        again = torch.cat([out, prompt(2, seed=3)], dim=1)
        out2, turn2 = w.chat(sid, again)
        assert torch.equal(out2, plain(w.reference, again))
        assert turn2.reused_tokens == out.shape[1] - 1 and turn2.recomputed_tokens == 0
    assert w.store.stats().tokens_recomputed == recomputed
    wait_for(
        lambda: w.agent_kv().get("tokens_recomputed") == recomputed,
        what="the agent to count the recomputed tokens",
    )
