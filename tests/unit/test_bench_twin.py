"""The twin check's pure parts (bench/twin_record.py): a recorded run turned into the
simulator's trace and replayed with the agent's policy, at the calibrated costs (`predict`)
or at each real swap's own (`follow`), and the verdict over paired runs."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest

from bench.twin_record import (
    NodeShape,
    RealSwapIn,
    Request,
    RunRecord,
    SwapSeen,
    first_divergence,
    latency_agrees,
    load_records,
    replay,
    swap_in_ends,
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
#: the calibrated swap-in with one victim: its swap-out, the fixed cost, 32 MiB at 1 GB/s
PREDICTED_SWAP_IN = 0.01 + 0.05 + 32 * MIB / 1e9


def request(model: str, at: float, *, latency: float = 0.002, wait: float = 0.0) -> Request:
    return Request(
        model=model,
        arrival_seconds=at,
        latency_seconds=latency,
        correct=True,
        queue_wait_seconds=wait,
    )


def swap(
    model: str, kind: str, at: float, number: int = 1, seconds: float | None = None
) -> SwapSeen:
    return SwapSeen(model=model, kind=kind, seen_at_seconds=at, number=number, seconds=seconds)  # type: ignore[arg-type]


def record(requests: list[Request], **changes: object) -> RunRecord:
    base = RunRecord(
        models=("a", "b", "c", "d", "e"),
        weights_bytes=32 * MIB,
        spec=POLICY,
        resident_at_start=("a", "b", "c"),
        requests=tuple(requests),
        duration_seconds=max(r.arrival_seconds for r in requests),
        swap_ins=1,
        swap_outs=1,
        swaps=(swap("c", "out", 1.1), swap("d", "in", 1.1, seconds=0.09)),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


# c was asked for first, so it is the least recently used when d comes
LRU_C = [request("c", 0.0), request("a", 0.2), request("b", 0.4), request("d", 1.0, wait=0.1)]


def test_a_record_becomes_a_trace_in_the_order_the_gateway_received_it() -> None:
    trace = to_trace(
        record(
            [
                request("d", 2.0, latency=0.5, wait=0.49),
                request("a", 0.5, latency=0.004),
                request("b", 1.0, latency=0.0025),
                # sent before b, received by the gateway after it: the agent saw b first
                replace(request("c", 0.9, latency=0.3), received_seconds=1.1),
            ]
        )
    )
    assert trace.arrival_seconds == [0.5, 1.0, 1.1, 2.0]
    assert trace.model_index == [0, 1, 2, 3]  # indices into the record's models
    assert trace.input_tokens == [0, 0, 0, 0]
    # service = from the end of the gateway's wait to the answer, in microsecond tokens:
    # c's way to the gateway (0.2 s) is not part of it
    assert trace.output_tokens == [4000, 2500, 100000, 10000]
    assert trace.duration_seconds == 2.0


def test_predict_evicts_the_least_recently_used_and_times_the_swap_like_the_engine() -> None:
    rec = record(LRU_C)
    sim = replay(rec, NODE).result
    assert (sim.swap_ins, sim.swap_outs, sim.cold_loads) == (1, 1, 0)
    assert sim.unserved_requests == []
    # admission -> the victim's swap-out (fixed) -> the swap-in's fixed cost and its copy
    # of 32 MiB over the 1 GB/s link: the engine times make_room inside its swap-in too
    assert sim.swap_in_seconds == pytest.approx([PREDICTED_SWAP_IN])
    # which victim: c is back only after another swap
    again = replay(replace(rec, requests=(*rec.requests, request("c", 2.0))), NODE).result
    assert (again.swap_ins, again.swap_outs) == (2, 2)
    other = replay(replace(rec, requests=(*rec.requests, request("a", 2.0))), NODE).result
    assert (other.swap_ins, other.swap_outs) == (1, 1)


def test_a_waiting_request_dates_the_end_of_the_swap_in_it_waited_for() -> None:
    rec = record(
        [
            request("d", 1.0, wait=0.20),  # ends its wait at 1.20
            request("d", 1.05, wait=0.16),  # at 1.21: the latest is the closest to the end
            request("d", 1.5),  # no wait: says nothing
            request("d", 3.0, wait=0.3),  # the second swap-in of d
        ],
        swaps=(
            swap("d", "in", 1.22, 1, seconds=0.19),
            swap("d", "in", 3.32, 2, seconds=None),  # a later one came before the poll
            swap("e", "in", 4.0, 1, seconds=0.2),  # no request waited for it
        ),
    )
    ends = swap_in_ends(rec)
    assert ends[("d", 1)] == RealSwapIn(
        seconds=0.19, ended_at_seconds=pytest.approx(1.21), waited_until_seconds=pytest.approx(1.21)
    )
    assert ends[("d", 2)] == RealSwapIn(
        seconds=None, ended_at_seconds=pytest.approx(3.3), waited_until_seconds=pytest.approx(3.3)
    )
    # nothing waited for e's: it followed d's (3.3) on the GPU, and took 0.2 s
    assert ends[("e", 1)] == RealSwapIn(seconds=0.2, ended_at_seconds=pytest.approx(3.5))


def test_in_a_burst_each_swap_in_ends_no_earlier_than_the_one_before_plus_its_own() -> None:
    # the requests reached the gateway later and later after they were sent: their waits
    # end, by the client's clock, before the swap-ins could have
    rec = record(
        [request("c", 1.0, wait=0.9), request("d", 1.01, wait=0.99), request("e", 1.02, wait=1.08)],
        swaps=(swap("c", "in", 2.0, seconds=0.2), swap("d", "in", 2.2, seconds=0.25),
               swap("e", "in", 2.3, seconds=0.2)),
    )  # fmt: skip
    ends = {key: e.ended_at_seconds for key, e in swap_in_ends(rec).items()}
    assert ends == {
        ("c", 1): pytest.approx(1.9),
        ("d", 1): pytest.approx(1.9 + 0.25),  # not 2.0
        ("e", 1): pytest.approx(2.3),  # 2.15 + 0.2 is after the poll that saw it: the poll's
    }


def test_follow_ends_each_swap_in_when_the_real_one_did_or_its_duration_after_admission() -> None:
    ended = record([*LRU_C[:3], request("d", 1.0, wait=0.25)],
                   swaps=(swap("c", "out", 1.26), swap("d", "in", 1.26, seconds=0.2)))  # fmt: skip
    sim = replay(ended, NODE, "follow").result
    assert sim.swap_in_seconds == pytest.approx([0.25])  # until the gateway's end, 1.25
    # admitted later than the real one ended (nothing waited here): its own duration
    lasted = replace(ended, requests=(*LRU_C[:3], request("d", 1.0)))
    assert replay(lasted, NODE, "follow").result.swap_in_seconds == pytest.approx([0.2])
    # no real cost for it: the calibrated one, the victim's swap-out included
    unknown = replace(ended, swaps=())
    followed = replay(unknown, NODE, "follow")
    assert followed.result.swap_in_seconds == pytest.approx([PREDICTED_SWAP_IN])
    assert followed.unrecorded_swap_ins == 1


def slow_swap_record() -> RunRecord:
    """a, b, c resident, a the least recently used. d comes at 1.0 (victim a), e at 1.05
    (queued behind d). d's real swap-in was slow (until 1.25), so b, asked for at 1.2, was
    still resident and had just served a request when e was admitted: c went for e."""
    return record(
        [
            request("a", 0.0),
            request("b", 0.2),
            request("c", 0.4),
            request("d", 1.0, wait=0.25),
            request("e", 1.05, wait=0.39),
            request("b", 1.2),
        ],
        swap_ins=2,
        swap_outs=2,
        swaps=(
            swap("a", "out", 1.26),
            swap("d", "in", 1.26, seconds=0.25),
            swap("c", "out", 1.45),
            swap("e", "in", 1.45, seconds=0.19),
        ),
    )


def test_follow_replays_what_the_real_swaps_decided_where_the_calibrated_costs_do_not() -> None:
    rec = slow_swap_record()
    followed = replay(rec, NODE, "follow")
    assert (followed.result.swap_ins, followed.result.swap_outs) == (2, 2)
    assert [(a.model, a.victims) for a in followed.admitted] == [("d", ("a",)), ("e", ("c",))]
    assert first_divergence(rec, followed) is None
    # at the calibrated cost d is in at 1.094, before b's request: b goes for e, and comes
    # back for its request
    predicted = replay(rec, NODE)
    assert (predicted.result.swap_ins, predicted.result.swap_outs) == (3, 3)
    parted = first_divergence(rec, predicted)
    assert parted is not None
    assert parted.startswith(
        "swap-in 2: real e (seen at 1.450 s; seen going out since the swap-in before: a, c); "
        "replayed e in"
    )
    assert "in place of b (admitted at 1.094 s;" in parted
    assert "b 0.202 s, c 0.402 s, d busy" in parted  # the marks the victim score ranked
    judged = verdict([rec], [followed], [predicted])
    assert judged["runs"][0]["swap_counts_match"]
    assert (judged["runs"][0]["predicted_swap_ins"], judged["runs"][0]["sim_swap_ins"]) == (3, 2)


def test_a_replay_with_a_swap_in_more_or_fewer_than_the_real_run_says_where() -> None:
    rec = slow_swap_record()
    fewer = replace(rec, swaps=rec.swaps[:2])
    assert first_divergence(fewer, replay(fewer, NODE, "follow")) == (
        "swap-in 2: no real one; replayed e in place of c (admitted at 1.250 s; resident "
        "models' last marks then: c 0.402 s, b 1.202 s, d busy); e asked for at 1.050 s"
    )
    more = replace(rec, swaps=(*rec.swaps, swap("a", "in", 9.0)))
    assert first_divergence(more, replay(more, NODE, "follow")) == (
        # c went out as e came in, seen by the same poll: it might have been a's victim
        "swap-in 3: real a (seen at 9.000 s; seen going out since the swap-in before: c); "
        "no replayed one"
    )
    # a poll that saw d come in may already see e's victim out (listed first): still e's
    early = replace(rec, swaps=(swap("a", "out", 1.26), swap("c", "out", 1.26),
                                swap("d", "in", 1.26, seconds=0.25),
                                swap("e", "in", 1.45, seconds=0.19)))  # fmt: skip
    assert first_divergence(early, replay(early, NODE, "follow")) is None


def test_the_latency_tolerance_is_the_larger_of_20_percent_and_20_ms() -> None:
    assert latency_agrees(0.050, 0.069)  # 20 ms floor
    assert not latency_agrees(0.050, 0.0705)
    assert latency_agrees(0.500, 0.599)  # 20 %
    assert not latency_agrees(0.500, 0.601)


def test_the_verdict_needs_equal_counts_in_every_run_and_close_medians() -> None:
    rec = record(LRU_C)
    followed, predicted = replay(rec, NODE, "follow"), replay(rec, NODE)
    real = replace(
        rec,
        swaps=(swap("c", "out", 1.2), swap("d", "in", 1.2, seconds=PREDICTED_SWAP_IN + 0.01)),
    )
    good = verdict([real, real], [followed, followed], [predicted, predicted])
    assert good["swap_counts_match"] and good["swap_in_latency_within_tolerance"]
    assert good["met"]
    assert good["runs"][0]["real_swap_ins"] == good["runs"][0]["sim_swap_ins"] == 1
    extra = replace(real, swap_ins=2, swap_outs=2)  # one run swapped once more for real
    bad = verdict([real, extra], [followed, followed], [predicted, predicted])
    assert not bad["swap_counts_match"] and not bad["met"]
    assert [r["swap_counts_match"] for r in bad["runs"]] == [True, False]
    slow = replace(real, swaps=(swap("d", "in", 1.5, seconds=0.5),))
    assert not verdict([slow], [followed], [predicted])["swap_in_latency_within_tolerance"]
    # no swap-in seen on one side: nothing to compare, so not met
    assert not verdict([replace(real, swaps=())], [followed], [predicted])["met"]


def test_a_record_written_as_json_reads_back_the_same() -> None:
    rec = replace(slow_swap_record(), seed=18, triton_compute_seconds={"a": 0.002})
    text = json.dumps({"nodes": [asdict(NODE)], "runs": [asdict(rec)]})
    shapes, records = load_records(json.loads(text))
    assert (shapes, records) == ([NODE], [rec])
    with pytest.raises(KeyError, match="swaps"):
        load_records(
            {"nodes": [], "runs": [{k: v for k, v in asdict(rec).items() if k != "swaps"}]}
        )
