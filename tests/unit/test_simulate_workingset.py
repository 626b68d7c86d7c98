"""`workingset.over_budget_arrivals`: the requests that arrive while the busy models of
their GPU need more bytes than it has."""

from __future__ import annotations

from modelswap_sidecar.simulate.traces import Trace
from modelswap_sidecar.simulate.workingset import over_budget_arrivals


def trace(arrivals: list[float], models: list[int]) -> Trace:
    n = len(arrivals)
    return Trace(
        arrival_seconds=arrivals,
        model_index=models,
        input_tokens=[0] * n,
        output_tokens=[1] * n,
        duration_seconds=arrivals[-1],
    )


def count(t: Trace, service: list[float], waits: list[float], assignment: list[int]) -> int:
    return over_budget_arrivals(
        t,
        service_seconds=service,
        waits_seconds=waits,
        model_bytes=[6, 6, 6],
        assignment=assignment,
        budget_bytes=[10, 10],
    )


def test_an_arrival_counts_while_its_gpus_busy_models_exceed_the_budget() -> None:
    # model 0 busy 0-5 s; model 1 asked at 1 s: 12 bytes busy on GPU 0 > 10
    t = trace([0.0, 1.0, 6.0], [0, 1, 1])
    assert count(t, [5.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0, 0, 0]) == 1
    # on two GPUs nothing is over
    assert count(t, [5.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0, 1, 0]) == 0


def test_a_wait_keeps_the_model_busy_and_an_end_at_the_arrival_frees_it_first() -> None:
    t = trace([0.0, 2.0, 3.0], [0, 1, 2])
    # model 0 waits 1 s then serves 1 s: busy until 2.0, when model 1 arrives (freed first)
    assert count(t, [1.0, 5.0, 1.0], [1.0, 0.0, 0.0], [0, 0, 0]) == 1  # only model 2's
    # a longer wait keeps model 0 busy past 2.0: model 1's arrival counts too
    assert count(t, [1.0, 5.0, 1.0], [1.5, 0.0, 0.0], [0, 0, 0]) == 2


def test_a_model_with_many_requests_counts_its_bytes_once() -> None:
    t = trace([0.0, 0.1, 0.2, 0.3], [0, 0, 0, 0])
    assert count(t, [9.0] * 4, [0.0] * 4, [0, 0, 0]) == 0
