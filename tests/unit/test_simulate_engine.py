"""`modelswap simulate`'s event loop on tiny hand-computable scenarios: exact waits and
swap counts for modelswap's policy and each baseline's rule."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from modelswap_sidecar.simulate.catalogue import CatalogueModel, resolve_policies
from modelswap_sidecar.simulate.engine import RunResult, run
from modelswap_sidecar.simulate.gpu import GpuShape
from modelswap_sidecar.simulate.policies import Dedicated, LeastRecentlyUsed, Modelswap, SimPolicy
from modelswap_sidecar.simulate.report import quantile, summarize
from modelswap_sidecar.simulate.scenario import PolicySpec, policy_settings
from modelswap_sidecar.simulate.traces import Trace

GB = 10**9
#: budget 25 GB: two 10 GB models fit, a third does not; copies at 10 GB/s (1 s for 10 GB)
SHAPE = GpuShape(
    hbm_bytes=25 * GB,
    reserve_bytes=0,
    per_process_overhead_bytes=0,
    host_store_bytes=1000 * GB,
    host_to_device_bytes_per_second=10e9,
    device_to_host_bytes_per_second=10e9,
    cold_load_bytes_per_second=2e9,
    cold_start_seconds=5.0,
    swap_in_fixed_seconds=0.05,
    swap_out_fixed_seconds=0.02,
    concurrent_requests=4,
)
#: room for one 10 GB model
ONE_FITS = replace(SHAPE, hbm_bytes=15 * GB)
SWAP_IN = 0.05 + 1.0
SWAP_OUT = 0.02
TUNED = {"swapPolicy": {"idleAfter": "never", "minResident": "0s"}}


def models(count: int, gb: int = 10) -> list[CatalogueModel]:
    # 0.01 s per output token: a request of N tokens holds a slot N/100 seconds
    return [
        CatalogueModel(name=f"m{i}", weights_bytes=gb * GB, per_output_token_seconds=0.01)
        for i in range(count)
    ]


def trace(*requests: tuple[float, int, int]) -> Trace:
    """(arrival, model, output tokens) per request, in arrival order."""
    return Trace(
        arrival_seconds=[r[0] for r in requests],
        model_index=[r[1] for r in requests],
        input_tokens=[0] * len(requests),
        output_tokens=[r[2] for r in requests],
        duration_seconds=3600.0,
    )


def modelswap(shape: GpuShape = SHAPE, **settings: float) -> Modelswap:
    spec = PolicySpec(name="modelswap", kind="modelswap", overrides={}, settings=settings)
    return Modelswap("modelswap", shape, policy_settings(spec, shape))


def simulate(
    policy: SimPolicy,
    catalogue: list[CatalogueModel],
    requests: Trace,
    *,
    warm: list[int],
    overrides: dict[str, Any] | None = None,
    gpus: int = 1,
    assignment: list[int] | None = None,
) -> RunResult:
    return run(
        requests,
        catalogue,
        resolve_policies(tuple(catalogue), overrides if overrides is not None else TUNED),
        policy,
        assignment=assignment if assignment is not None else [0] * len(catalogue),
        gpus=gpus,
        warm_order=warm,
    )


def waits(result: RunResult) -> dict[int, float]:
    return dict(zip(result.waited_requests, result.waits_seconds, strict=True))


def test_a_swap_in_waits_for_its_victim_then_the_copy() -> None:
    # two 10 GB models, room for one: m0 resident, m1 out; each request swaps the other in
    result = simulate(
        modelswap(ONE_FITS),
        models(2),
        trace((0, 0, 100), (100, 1, 100), (200, 0, 100)),
        warm=[0, 1],
    )
    assert waits(result) == {
        1: pytest.approx(SWAP_OUT + SWAP_IN),
        2: pytest.approx(SWAP_OUT + SWAP_IN),
    }
    assert (result.swap_ins, result.swap_outs, result.cold_loads) == (2, 2, 0)
    assert result.unserved_requests == []


def test_swap_ins_on_one_gpu_are_admitted_one_at_a_time() -> None:
    # m0, m1 resident; m2 and m3 asked for at once: m2 swaps m0 out and copies; m3 is
    # admitted only once m2's swap-in is done (the agent's admission lock holds a GPU's
    # admission and its swap for the whole swap-in), then swaps m1 out and copies
    result = simulate(
        modelswap(),
        models(4),
        trace((100, 2, 100), (100, 3, 100)),
        warm=[0, 1, 2, 3],
    )
    m2_done = 100 + SWAP_OUT + SWAP_IN
    assert waits(result) == {
        0: pytest.approx(m2_done - 100),
        1: pytest.approx(m2_done + SWAP_OUT + SWAP_IN - 100),
    }
    assert (result.swap_ins, result.swap_outs) == (2, 2)
    # each swap-in timed as the engine times it: from its admission, victim's swap-out in
    assert result.swap_in_seconds == pytest.approx([SWAP_OUT + SWAP_IN] * 2)


def test_a_swap_in_waits_for_a_busy_model_to_become_idle() -> None:
    # m0's request runs 10 s; m1 needs its room: the policy waits for m0 to become idle
    # (WaitingForIdle), well within its busy-victim wait, and swaps it out then
    result = simulate(
        modelswap(ONE_FITS),
        models(2),
        trace((0, 0, 1000), (1, 1, 100)),
        warm=[0, 1],
    )
    assert waits(result) == {1: pytest.approx(10 - 1 + SWAP_OUT + SWAP_IN)}


def test_the_first_model_to_become_idle_makes_room_not_a_drained_one() -> None:
    # m0 (30 s) and m2 (5 s) are both busy when m1 asks at t=1; draining one would have
    # taken m0 (same requests in flight, first by uid) and held m1 until t=30; waiting
    # takes m2 when its request ends at t=5
    result = simulate(
        modelswap(),
        models(3),
        trace((0, 0, 3000), (0, 2, 500), (1, 1, 100)),
        warm=[0, 2, 1],
    )
    assert waits(result) == {2: pytest.approx(5 - 1 + SWAP_OUT + SWAP_IN)}
    assert (result.swap_outs, result.swap_ins) == (1, 1)


def test_a_busy_victim_drains_once_the_wait_is_over() -> None:
    # one slot: m0 runs A (0-20 s) with B queued behind it; m1 asks at t=1. m0 never
    # becomes idle by itself (B would run 20-40 s), so at t=11, the end of the 10 s
    # busy-victim wait (asked again at that time with nothing else happening), m0 is
    # taken: B goes back to waiting for m0, A drains until t=20, then m1 swaps in
    shape = replace(ONE_FITS, concurrent_requests=1)
    result = simulate(
        modelswap(shape),
        models(2),
        trace((0, 0, 2000), (0.5, 0, 2000), (1, 1, 100)),
        warm=[0, 1],
    )
    assert waits(result)[2] == pytest.approx(20 - 1 + SWAP_OUT + SWAP_IN)
    m1_done = 20 + SWAP_OUT + SWAP_IN + 1.0
    assert waits(result)[1] == pytest.approx(m1_done + SWAP_OUT + SWAP_IN - 0.5)


def test_requests_queue_for_compute_slots() -> None:
    shape = replace(SHAPE, concurrent_requests=1)
    result = simulate(modelswap(shape), models(1), trace((0, 0, 100), (0.5, 0, 100)), warm=[0])
    assert waits(result) == {1: pytest.approx(0.5)}


def test_default_policy_swaps_out_after_idle_after() -> None:
    # idleAfter 10m: m0 idle from t=1 (its request's end) goes out at 601; the next request
    # at 700 swaps it back in
    result = simulate(
        modelswap(),
        models(1),
        trace((0, 0, 100), (700, 0, 100)),
        warm=[0],
        overrides={},
    )
    assert waits(result) == {1: pytest.approx(SWAP_IN)}
    assert (result.swap_outs, result.swap_ins) == (1, 1)


def test_keepalive_unloads_after_five_idle_minutes_and_reloads_cold() -> None:
    policy = LeastRecentlyUsed("keepalive", SHAPE, kind="keepalive", idle_after_seconds=300)
    result = simulate(policy, models(1), trace((0, 0, 100), (400, 0, 100)), warm=[0])
    assert waits(result) == {1: pytest.approx(5.0 + 10 / 2)}  # start + 10 GB at 2 GB/s
    assert (result.swap_outs, result.cold_loads, result.swap_ins) == (1, 1, 0)


def test_lru_unloads_the_least_recently_used_idle_model_only_when_full() -> None:
    policy = LeastRecentlyUsed("lru", SHAPE, kind="lru")
    result = simulate(
        policy,
        models(3),
        trace((0, 1, 100), (50, 0, 100), (400, 0, 100), (500, 2, 100), (600, 1, 100)),
        warm=[0, 1, 2],
    )
    # no timer: m0 is still loaded at 400; m2 evicts m1 (used at 0) not m0 (used at 400);
    # m1 then comes back cold, evicting m0
    assert waits(result) == {3: pytest.approx(SWAP_OUT + 10.0), 4: pytest.approx(SWAP_OUT + 10.0)}
    assert result.cold_loads == 2


def test_sleepwake_copies_out_and_back_at_its_rate() -> None:
    policy = LeastRecentlyUsed(
        "sleepwake", ONE_FITS, kind="sleepwake", warm_bytes_per_second=15e9, wake_fixed_seconds=0.18
    )
    result = simulate(policy, models(2), trace((0, 0, 100), (100, 1, 100)), warm=[0, 1])
    # sleep copies m0's 10 GB out, then the wake copies m1's in, both at 15 GB/s
    assert waits(result) == {1: pytest.approx(10 / 15 + 0.18 + 10 / 15)}
    assert (result.swap_ins, result.cold_loads) == (1, 0)


def test_dedicated_never_swaps() -> None:
    result = simulate(
        Dedicated("dedicated", SHAPE),
        models(3),
        trace((0, 0, 100), (1, 1, 100), (2, 2, 100)),
        warm=[0, 1, 2],
        gpus=3,
        assignment=[0, 1, 2],
    )
    assert waits(result) == {}
    assert (result.swap_ins, result.swap_outs, result.cold_loads) == (0, 0, 0)


def test_added_latency_is_the_wait_beyond_the_dedicated_run() -> None:
    shape = replace(SHAPE, concurrent_requests=1)
    requests = trace((0, 0, 100), (0.5, 0, 100))
    dedicated = simulate(Dedicated("d", shape), models(1), requests, warm=[0])
    shared = simulate(modelswap(shape), models(1), requests, warm=[0])
    reference = [0.0, 0.5]
    summary = summarize(shared, 1.0, reference)
    assert summary.p99_added_seconds == 0.0
    assert summary.p99_wait_seconds == pytest.approx(0.5)
    assert summarize(dedicated, 1.0, reference).waited_share == 0.0


def test_quantiles_count_zero_waits_and_unserved_requests() -> None:
    assert quantile([], 100, 0, 0.99) == 0.0
    assert quantile([2.0], 100, 0, 0.99) == 0.0  # rank 99 of 100: still a zero
    assert quantile([1.0, 2.0], 100, 0, 0.99) == 1.0
    assert quantile([1.0], 100, 1, 0.999) == float("inf")
