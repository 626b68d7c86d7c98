# ruff: noqa: F811 (the parameters named as the imported fixtures are those fixtures)
"""tinyllama's batching (issue 29, item 5), its model.py in this process: concurrent greedy
requests without a session run as one batch padded to the longest prompt, every answer
still plain transformers' `generate`, each last response counting the pad tokens its
prompt got; the same requests in runs of similar length (what the gateway's batch shaping
sends) pad less than mixed. Sampling and logprobs requests run on their own."""

from __future__ import annotations

import functools
import types
from collections.abc import Sequence
from typing import Any

import pytest

# the example's fixtures: pytest finds them by these names, which the tests' parameters repeat
from tests.integration.test_example_tinyllama import (  # noqa: F401
    MAX_TOKENS,
    Answer,
    InProcess,
    Reference,
    _Request,
    _Sender,
    model_py,
    reference,
    torch_threads,
)
from tests.support.waiting import wait_for

SHORT = ("The quick brown fox", "hi", "", "Ünïcødé ✓ 漢字")
LONG = ("modelswap pages idle models out " * 12, "a much longer prompt, " * 25)


def batched(
    model_py: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    rows: int,
    delay_seconds: float = 0.5,
) -> InProcess:
    """The model as config.pbtxt sets it up, with at most `rows` rows a batch and a delay
    long enough that requests sent together share batches on a loaded machine."""
    served = InProcess(model_py, monkeypatch)
    served.model.batcher = model_py.Batcher(
        served.model.run_batch, max_rows=rows, delay_seconds=delay_seconds
    )
    return served


def run(
    served: InProcess, requests: Sequence[tuple[str, dict[str, Any]]], *, in_order: bool = False
) -> list[tuple[Answer, int | None]]:
    """Each answer with its last response's padded_tokens (None when it ran alone);
    `in_order`: each request reaches the batcher before the next is sent (all batched)."""
    senders = [_Sender(served.att) for _ in requests]
    batcher = served.model.batcher
    with torch_threads(1):
        if in_order:
            for sender, (text, parameters) in zip(senders, requests, strict=True):
                before = batcher.arrived
                served.model.execute([_Request(sender, text, parameters)])
                wait_for(
                    functools.partial(lambda n: batcher.arrived > n, before),
                    30,
                    f"{text[:20]!r} to reach the batcher",
                )
        else:
            served.model.execute(
                [_Request(s, text, p) for s, (text, p) in zip(senders, requests, strict=True)]
            )
        answers = [s.answer() for s in senders]
    wait_for(lambda: not served.model.threads, 30, "the request threads to end")
    padded = []
    for sender in senders:
        last = sender.sent[-1][0]
        value = None if last is None else last.outputs.get("padded_tokens")
        padded.append(None if value is None else int(value.reshape(-1)[0]))
    return list(zip(answers, padded, strict=True))


@pytest.fixture
def closes() -> Any:
    models: list[InProcess] = []
    yield models.append
    for served in models:
        served.model.finalize()


def test_one_batch_answers_as_transformers_and_counts_its_padding(
    model_py: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    reference: Reference,
    closes: Any,
) -> None:
    served = batched(model_py, monkeypatch, rows=8)
    closes(served)
    texts = [*SHORT, *LONG]
    requests = [(t, {"max_tokens": MAX_TOKENS}) for t in texts]
    requests.append((SHORT[0], {"max_tokens": 3}))  # a row that ends before the others
    results = run(served, requests)
    longest = max(len(reference.ids(t)) for t, _ in requests)
    for (text, parameters), (answer, padded) in zip(requests, results, strict=True):
        expected = reference.tokens(text, parameters["max_tokens"])
        assert answer.error is None, answer.error
        assert answer.tokens == expected, text
        assert answer.text == reference.text(expected)
        finish = "stop" if expected and expected[-1] in served.model.eos else "length"
        assert answer.finish_reason == finish
        assert padded == longest - len(reference.ids(text)), text
    assert served.att.depth == 0 and served.att.entered >= 1


def test_runs_of_similar_length_pad_less_than_mixed_and_answer_the_same(
    model_py: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    reference: Reference,
    closes: Any,
) -> None:
    served = batched(model_py, monkeypatch, rows=2)
    closes(served)
    mixed = [LONG[0], SHORT[0], LONG[1], SHORT[1]]
    shaped = [SHORT[0], SHORT[1], LONG[0], LONG[1]]  # the gateway's order: shorter first
    totals = {}
    for name, order in (("mixed", mixed), ("shaped", shaped)):
        results = run(served, [(t, {"max_tokens": 4}) for t in order], in_order=True)
        for text, (answer, padded) in zip(order, results, strict=True):
            assert answer.tokens == reference.tokens(text, 4), (name, text)
            assert padded is not None
        totals[name] = sum(padded or 0 for _, padded in results)
    useful = sum(len(reference.ids(t)) for t in mixed)
    assert totals["shaped"] < totals["mixed"], (totals, useful)


def test_sampling_logprobs_and_errors_run_on_their_own(
    model_py: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    reference: Reference,
    closes: Any,
) -> None:
    served = batched(model_py, monkeypatch, rows=8)
    closes(served)
    requests: list[tuple[str, dict[str, Any]]] = [
        (SHORT[0], {"max_tokens": 4, "temperature": 0.8, "seed": 1}),
        (SHORT[0], {"max_tokens": 4, "logprobs": 2}),
        (SHORT[0], {"max_tokens": 0}),
        (SHORT[1], {"max_tokens": 4}),
    ]
    results = run(served, requests)
    sampled, scored, refused, greedy = results
    assert sampled[0].error is None and sampled[1] is None
    assert scored[0].tokens == reference.tokens(SHORT[0], 4) and scored[1] is None
    assert refused[0].error is not None and "max_tokens" in refused[0].error
    assert greedy[0].tokens == reference.tokens(SHORT[1], 4) and greedy[1] == 0


def test_a_batch_keeps_to_the_group_of_its_oldest_request(
    model_py: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    reference: Reference,
    closes: Any,
) -> None:
    served = batched(model_py, monkeypatch, rows=8, delay_seconds=2.0)
    closes(served)
    # interleaved as they may reach the model; the gateway released them as two groups
    order = [SHORT[0], LONG[0], SHORT[1], LONG[1]]
    groups = ["1", "2", "1", "2"]
    requests = [
        (t, {"max_tokens": 4, "batch_group": g}) for t, g in zip(order, groups, strict=True)
    ]
    results = run(served, requests, in_order=True)
    for text, (answer, _) in zip(order, results, strict=True):
        assert answer.tokens == reference.tokens(text, 4), text
    lengths = [len(reference.ids(t)) for t in order]
    # each padded to the longest of its own group only
    assert [p for _, p in results] == [
        max(lengths[0], lengths[2]) - lengths[0],
        max(lengths[1], lengths[3]) - lengths[1],
        max(lengths[0], lengths[2]) - lengths[2],
        max(lengths[1], lengths[3]) - lengths[3],
    ]
