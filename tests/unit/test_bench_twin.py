"""The twin check's pure parts (bench/twin_record.py): a recorded run turned into the
simulator's trace and replayed with the agent's policy, and the verdict over paired runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.twin_record import (
    NodeShape,
    Request,
    RunRecord,
    latency_agrees,
    replay,
    to_trace,
    verdict,
)

MIB = 1 << 20
POLICY = {"swapPolicy": {"idleAfter": "never", "minResident": "0s", "priority": 100}}
NODE = NodeShape(
    hbm_bytes=112 * MIB,
    reserve_bytes=0,
    per_process_overhead_bytes=0,
    pace_bytes_per_second=1e9,
    swap_in_fixed_seconds=0.05,
    swap_out_fixed_seconds=0.01,
)


def request(model: str, at: float) -> Request:
    return Request(model=model, arrival_seconds=at, latency_seconds=0.01, correct=True)


def record(requests: list[Request], **changes: object) -> RunRecord:
    base = RunRecord(
        models=("a", "b", "c", "d"),
        weights_bytes=32 * MIB,
        spec=POLICY,
        resident_at_start=("a", "b", "c"),
        requests=tuple(requests),
        service_seconds={"a": 0.002, "b": 0.004, "c": 0.001, "d": 0.0025},
        duration_seconds=max(r.arrival_seconds for r in requests),
        swap_ins=1,
        swap_outs=1,
        swap_in_seconds=(0.09,),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_record_becomes_a_sorted_trace_with_each_models_service_time() -> None:
    trace = to_trace(record([request("d", 2.0), request("a", 0.5), request("b", 1.0)]))
    assert trace.arrival_seconds == [0.5, 1.0, 2.0]
    assert trace.model_index == [0, 1, 3]  # indices into the record's models
    assert trace.input_tokens == [0, 0, 0]
    # service seconds as microsecond tokens: 2 ms, 4 ms, 2.5 ms
    assert trace.output_tokens == [2000, 4000, 2500]
    assert trace.duration_seconds == 2.0


def test_the_replay_evicts_the_least_recently_used_and_times_the_swap_like_the_engine() -> None:
    # a, b, c resident (3 x 32 MiB fill the 112 MiB GPU under its high watermark); c was
    # asked for first, so it is the least recently used when d comes
    rec = record([request("c", 0.0), request("a", 0.2), request("b", 0.4), request("d", 1.0)])
    sim = replay(rec, NODE)
    assert (sim.swap_ins, sim.swap_outs, sim.cold_loads) == (1, 1, 0)
    assert sim.unserved_requests == []
    # admission -> the victim's swap-out (fixed) -> the swap-in's fixed cost and its copy
    # of 32 MiB over the 1 GB/s link: the engine times make_room inside its swap-in too
    assert sim.swap_in_seconds == pytest.approx([0.01 + 0.05 + 32 * MIB / 1e9])
    # which victim: c is back only after another swap
    again = replay(replace(rec, requests=(*rec.requests, request("c", 2.0))), NODE)
    assert (again.swap_ins, again.swap_outs) == (2, 2)
    other = replay(replace(rec, requests=(*rec.requests, request("a", 2.0))), NODE)
    assert (other.swap_ins, other.swap_outs) == (1, 1)


def test_the_latency_tolerance_is_the_larger_of_20_percent_and_20_ms() -> None:
    assert latency_agrees(0.050, 0.069)  # 20 ms floor
    assert not latency_agrees(0.050, 0.0705)
    assert latency_agrees(0.500, 0.599)  # 20 %
    assert not latency_agrees(0.500, 0.601)


def test_the_verdict_needs_equal_counts_in_every_run_and_close_medians() -> None:
    rec = record([request("c", 0.0), request("a", 0.2), request("b", 0.4), request("d", 1.0)])
    sim = replay(rec, NODE)
    real = replace(rec, swap_in_seconds=(sim.swap_in_seconds[0] + 0.01,))
    good = verdict([real, real], [sim, sim])
    assert good["swap_counts_match"] and good["swap_in_latency_within_tolerance"]
    assert good["met"]
    assert good["runs"][0]["real_swap_ins"] == good["runs"][0]["sim_swap_ins"] == 1
    extra = replace(real, swap_ins=2, swap_outs=2)  # one run swapped once more for real
    bad = verdict([real, extra], [sim, sim])
    assert not bad["swap_counts_match"] and not bad["met"]
    assert [r["swap_counts_match"] for r in bad["runs"]] == [True, False]
    slow = replace(real, swap_in_seconds=(0.5,))
    assert not verdict([slow], [sim])["swap_in_latency_within_tolerance"]
    # no swap-in seen on one side: nothing to compare, so not met
    assert not verdict([replace(real, swap_in_seconds=())], [sim])["met"]
