"""The gateway bench's reading of event-loop lag: the agent's histogram between two
scrapes, and the load generator's own samples."""

from __future__ import annotations

import math

import pytest

from bench.loop_lag import Histogram, between, of_samples, parse_histogram

NAME = "modelswap_agent_event_loop_lag_seconds"


def exposition(counts: dict[str, int], total: float) -> str:
    lines = ["# HELP x", f"# TYPE {NAME} histogram"]
    lines += [f'{NAME}_bucket{{le="{le}"}} {n}.0' for le, n in counts.items()]
    lines += [f"{NAME}_count {counts['+Inf']}.0", f"{NAME}_sum {total}"]
    lines += ['modelswap_swap_ins_total{uid="u",namespace="n",model="m"} 3.0']
    return "\n".join(lines) + "\n"


def test_the_histogram_is_read_from_the_exposition() -> None:
    text = exposition({"0.0025": 10, "0.005": 12, "0.01": 13, "+Inf": 13}, 0.04)
    found = parse_histogram(text)
    assert found.buckets == {0.0025: 10, 0.005: 12, 0.01: 13, math.inf: 13}
    assert found.sum_seconds == 0.04


def test_a_missing_histogram_is_an_error_that_names_it() -> None:
    with pytest.raises(ValueError, match=NAME):
        parse_histogram("modelswap_swap_ins_total 1.0\n")


def test_only_what_the_window_counted_is_summarised() -> None:
    before = Histogram({0.0025: 100, 0.005: 100, 0.01: 101, 0.025: 101, math.inf: 101}, 0.2)
    after = Histogram({0.0025: 140, 0.005: 142, 0.01: 144, 0.025: 145, math.inf: 145}, 0.35)
    window = between(before, after)
    assert (window.samples, window.stalls) == (44, 2)  # 40 + 2 within 5 ms, 2 later
    assert window.worst_seconds == 0.025 and not window.beyond
    assert window.total_seconds == pytest.approx(0.15)
    assert "2 of 44 timers more than 5 ms late (the worst at most 25.0 ms" in window.words()


def test_a_sample_past_the_last_bucket_is_said_to_be_over_it() -> None:
    before = Histogram({0.0025: 0, 5.0: 0, math.inf: 0}, 0.0)
    after = Histogram({0.0025: 3, 5.0: 3, math.inf: 4}, 7.0)
    window = between(before, after)
    assert window.beyond and window.worst_seconds == 5.0
    assert "the worst over 5000.0 ms" in window.words()


def test_a_window_without_samples_has_no_worst() -> None:
    same = Histogram({0.0025: 5, math.inf: 5}, 0.001)
    assert between(same, same).worst_seconds == 0.0 and between(same, same).samples == 0


def test_own_samples_are_summarised_exactly() -> None:
    own = of_samples([0.001, 0.004, 0.012, 0.006])
    assert (own.samples, own.stalls, own.worst_seconds) == (4, 2, 0.012)
    assert own.total_seconds == pytest.approx(0.023)
