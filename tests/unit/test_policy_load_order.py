"""The order models waiting for HBM are placed in (`policy.load_order`, issue 26 item 5):
pinned first, then by priority (highest first), ties in the order given."""

from __future__ import annotations

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.policy import EffectivePolicy, effective_policy
from modelswap_sidecar.policy.load_order import load_order


def policy(**swap: object) -> EffectivePolicy:
    spec = {"model": {"source": {"uri": "/models/m"}, "weightsBytes": "1Mi"}, "swapPolicy": swap}
    return effective_policy(spec, BUILTIN_DEFAULTS)


def test_a_pinned_model_comes_first_even_when_its_uid_sorts_last() -> None:
    models = [
        ("0-low", policy(priority=0)),
        ("1-high", policy(priority=9)),
        ("2-mid", policy(priority=5)),
        ("z-pinned", policy(pinned=True, priority=0)),
    ]
    ordered = [uid for uid, _ in load_order(sorted(models), lambda m: m[1])]
    assert ordered == ["z-pinned", "1-high", "2-mid", "0-low"]


def test_pinned_models_go_by_priority_among_themselves_and_ties_keep_the_given_order() -> None:
    given = [
        ("c", policy(priority=1)),
        ("a", policy(priority=1)),
        ("p2", policy(pinned=True, priority=1)),
        ("b", policy(priority=1)),
        ("p1", policy(pinned=True, priority=3)),
        ("p3", policy(pinned=True, priority=1)),
    ]
    ordered = [uid for uid, _ in load_order(given, lambda m: m[1])]
    assert ordered == ["p1", "p2", "p3", "c", "a", "b"]
    # the same inputs always give the same order, and the input is left as it was
    assert [uid for uid, _ in load_order(given, lambda m: m[1])] == ordered
    assert [uid for uid, _ in given] == ["c", "a", "p2", "b", "p1", "p3"]


def test_no_models_give_an_empty_order() -> None:
    none: list[EffectivePolicy] = []
    assert load_order(none, lambda p: p) == []
