"""The fuzz run's generator of hostile gateway requests (tests/support/hostile_bodies.py):
seeded, every family drawn, and never the word that asks the toy models to fail."""

from __future__ import annotations

import json
from collections import Counter

from tests.support.hostile_bodies import FAMILIES, hostile_inputs


def test_the_same_seed_gives_the_same_inputs_and_every_family_is_drawn() -> None:
    first = list(hostile_inputs(7, 2_000))
    assert first == list(hostile_inputs(7, 2_000))
    assert first != list(hostile_inputs(8, 2_000))
    kinds = Counter(one.kind for one in first)
    assert len(kinds) == len(FAMILIES), kinds
    raw = [one for one in first if one.raw is not None]
    assert raw and all(one.kind == "raw HTTP/1.1" for one in raw)
    assert any(one.half_close for one in raw) and not all(one.half_close for one in raw)


def test_no_input_asks_a_toy_model_to_fail() -> None:
    """`raise` (a LABEL of batched, a string of hashembed) makes the toy fail on purpose:
    a model's own 500, not the gateway's."""
    for one in hostile_inputs(20261127, 3_000):
        try:
            body = json.loads(one.body)
        except ValueError:
            continue  # not JSON (broken on purpose, or binary tensors after a JSON header)
        assert '"raise"' not in json.dumps(body), one
