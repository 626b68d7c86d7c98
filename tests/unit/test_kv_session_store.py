"""`modelswap_client.kv_sessions` without an agent: a follow-up turn reuses its session's
cached prefix; lost bytes (a discard, host blocks taken) are computed again from the
session's token ids before the turn; sessions are capped and evicted least recently used
within the tiers; every answer equals plain transformers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from modelswap_client.errors import ClientError  # noqa: E402
from modelswap_client.kv_sessions import KvSessionStore  # noqa: E402
from modelswap_client.kvpool import KvPoolFull  # noqa: E402
from tests.unit.test_kv_tiered_cache import Kv, llama, plain, pooled, prompt  # noqa: E402

NEW = 6


def store(kv: Kv, max_sessions: int = 4, hold: Any = contextlib.nullcontext) -> KvSessionStore:
    return KvSessionStore(
        kv.tensors, namespace="ns", model="m", max_sessions=max_sessions, hold=hold
    )


def chat(s: KvSessionStore, model: Any, sid: str, ids: Any) -> tuple[Any, Any]:
    with s.turn(sid, ids, model) as turn:
        out = pooled(model, ids, NEW, turn.cache)
        turn.keep(out)
    return out, turn


def test_a_follow_up_turn_reuses_the_prefix_and_answers_as_plain_transformers() -> None:
    model, kv = llama(), None
    kv = Kv(model)
    s = store(kv)
    first, t1 = chat(s, model, "u1", prompt(30))
    assert (t1.reused_tokens, t1.recomputed_tokens) == (0, 0)
    follow = torch.cat([first, prompt(4, seed=7)], dim=1)
    out, t2 = chat(s, model, "u1", follow)
    assert torch.equal(out, plain(model, follow, NEW))
    assert t2.reused_tokens == first.shape[1] - 1 and t2.recomputed_tokens == 0
    st = s.stats()
    assert (st.hits, st.misses, st.tokens_recomputed) == (1, 1, 0)
    assert st.tokens_reused == t2.reused_tokens
    assert st.device_blocks == 3 and st.host_blocks > 0
    assert (st.namespace, st.model, st.sessions) == ("ns", "m", 1)


def test_a_prompt_that_diverges_reuses_only_the_shared_prefix() -> None:
    model = llama()
    kv = Kv(model)
    s = store(kv)
    first, _ = chat(s, model, "u", prompt(30))
    edited = torch.cat([first[:, :12], prompt(10, seed=8)], dim=1)
    out, t = chat(s, model, "u", edited)
    assert t.reused_tokens == 12
    assert torch.equal(out, plain(model, edited, NEW))


def test_the_same_prompt_again_leaves_one_token_to_compute() -> None:
    model = llama()
    kv = Kv(model)
    s = store(kv)
    ids = prompt(20)
    chat(s, model, "u", ids)
    out, t = chat(s, model, "u", ids)
    assert t.reused_tokens == 19
    assert torch.equal(out, plain(model, ids, NEW))


def test_a_discard_is_recomputed_from_the_token_ids_and_counted() -> None:
    model = llama()
    kv = Kv(model)
    s = store(kv)
    first, _ = chat(s, model, "u", prompt(40))
    kv.generation += 1  # a discard swap-out
    follow = torch.cat([first, prompt(3, seed=2)], dim=1)
    out, t = chat(s, model, "u", follow)
    assert (t.reused_tokens, t.recomputed_tokens) == (0, first.shape[1] - 1)
    assert torch.equal(out, plain(model, follow, NEW))
    st = s.stats()
    assert st.tokens_recomputed == first.shape[1] - 1 and st.misses == 2 and st.hits == 0


def test_sessions_beyond_max_sessions_are_evicted_least_recently_used() -> None:
    model = llama()
    kv = Kv(model)
    s = store(kv, max_sessions=2)
    a, _ = chat(s, model, "a", prompt(10, seed=1))
    chat(s, model, "b", prompt(10, seed=2))
    chat(s, model, "a", torch.cat([a, prompt(2)], dim=1))  # a is now the most recent
    chat(s, model, "c", prompt(10, seed=3))
    assert "b" not in s and "a" in s and "c" in s
    assert s.stats().evictions == 1


def test_a_full_hbm_tier_evicts_whole_sessions_and_they_recompute_correctly() -> None:
    model = llama()
    kv = Kv(model, hbm_blocks=6)  # two sessions of 3 HBM blocks each
    s = store(kv)
    a, _ = chat(s, model, "a", prompt(20, seed=1))  # 25 tokens: 3 HBM + 1 host block
    chat(s, model, "b", prompt(20, seed=2))
    chat(s, model, "c", prompt(20, seed=3))  # no HBM block left: a goes
    assert "a" not in s and s.stats().evictions == 1
    follow = torch.cat([a, prompt(3)], dim=1)
    out, t = chat(s, model, "a", follow)  # a miss: all of it computed by generate
    assert t.reused_tokens == 0
    assert torch.equal(out, plain(model, follow, NEW))


def test_host_blocks_taken_are_recomputed_as_the_lost_tail() -> None:
    model = llama()
    kv = Kv(model, host_blocks=4)  # 32 host tokens
    s = store(kv)
    a, _ = chat(s, model, "a", prompt(40, seed=1))  # 24 HBM + 21 host tokens
    chat(s, model, "b", prompt(40, seed=2))  # takes a's host blocks
    assert s.stats().evictions == 1 and "a" in s
    follow = torch.cat([a, prompt(3)], dim=1)
    out, t = chat(s, model, "a", follow)
    assert t.reused_tokens == 24  # its HBM blocks kept their K/V
    assert t.recomputed_tokens == a.shape[1] - 1 - 24
    assert torch.equal(out, plain(model, follow, NEW))


def test_a_session_alone_beyond_the_tiers_fails_and_is_dropped() -> None:
    model = llama()
    kv = Kv(model, hbm_blocks=2)
    s = store(kv)
    with pytest.raises(KvPoolFull, match="this session alone"):
        chat(s, model, "big", prompt(20))
    assert "big" not in s and kv.pool.hbm_blocks_free == 2


def test_every_turn_runs_inside_hold() -> None:
    model = llama()
    kv = Kv(model)
    held: list[str] = []

    @contextlib.contextmanager
    def hold() -> Iterator[None]:
        held.append("in")
        yield
        held.append("out")

    s = store(kv, hold=hold)
    with s.turn("u", prompt(5), model):
        assert held == ["in"]
    assert held == ["in", "out"]


def test_keep_refuses_a_sequence_that_is_not_the_turns() -> None:
    model = llama()
    s = store(Kv(model))
    with pytest.raises(ClientError, match="does not start"), s.turn("u", prompt(5), model) as t:
        t.keep(prompt(8, seed=99))
    assert "u" not in s  # a failed turn drops its session


def test_forget_gives_the_blocks_back() -> None:
    model = llama()
    kv = Kv(model)
    s = store(kv)
    chat(s, model, "u", prompt(40))
    s.forget("u")
    assert kv.pool.hbm_blocks_free == 16 and kv.pool.host_blocks_free == 32
    assert s.stats().sessions == 0


def test_a_turn_needs_one_sequence_of_at_least_one_token() -> None:
    model = llama()
    s = store(Kv(model))
    with pytest.raises(ClientError, match="at least one input token"), s.turn("u", [], model):
        pass
    with pytest.raises(ClientError, match="batch of 2"), s.turn("u", [[1, 2], [3, 4]], model):
        pass
    with pytest.raises(ValueError, match="max_sessions"):
        store(Kv(model), max_sessions=0)
