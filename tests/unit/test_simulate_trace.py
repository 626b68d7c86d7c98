"""Traces for `modelswap simulate`: the CSV reader refuses bad rows by line and column, and
the generator's statistics (Zipf shares, rate, diurnal swing, burstiness, tokens) hold."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from pathlib import Path

import pytest

from modelswap_sidecar.simulate.errors import TraceError
from modelswap_sidecar.simulate.traces import (
    GeneratorSpec,
    gamma_arrivals,
    generate,
    lognormal_tokens,
    read_csv,
    write_csv,
    zipf_shares,
)

NAMES = ["a", "b"]


def csv_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_reads_rows_in_any_column_order_and_sorts_them(tmp_path: Path) -> None:
    path = csv_file(
        tmp_path,
        "model,timestamp,output_tokens,input_tokens,note\n"
        "b,1700000010.5,20,5,x\n"
        "a,1700000000,10,3,y\n",
    )
    trace = read_csv(path, NAMES)
    assert trace.arrival_seconds == [0.0, 10.5]
    assert trace.model_index == [0, 1]
    assert trace.input_tokens == [3, 5]
    assert trace.output_tokens == [10, 20]


@pytest.mark.parametrize(
    ("row", "where"),
    [
        ("soon,a,1,1", ":3: column timestamp: 'soon' is not a number"),
        ("nan,a,1,1", ":3: column timestamp: 'nan' is not a finite"),
        ("2,c,1,1", ":3: column model: 'c' is not a model of the catalogue"),
        ("2,a,1.5,1", ":3: column input_tokens: '1.5' is not a whole number"),
        ("2,a,1,-4", ":3: column output_tokens: '-4' is not a whole number"),
        ("2,a,1,0", ":3: column output_tokens: '0' must be at least 1"),
        ("2,a,1", ":3: 3 columns, the header has 4"),
    ],
)
def test_a_bad_row_is_refused_naming_line_and_column(tmp_path: Path, row: str, where: str) -> None:
    path = csv_file(tmp_path, f"timestamp,model,input_tokens,output_tokens\n1,a,1,1\n{row}\n")
    with pytest.raises(TraceError) as e:
        read_csv(path, NAMES)
    assert f"{path}{where}" in str(e.value)


def test_a_header_without_a_column_is_refused(tmp_path: Path) -> None:
    path = csv_file(tmp_path, "timestamp,model,output_tokens\n1,a,1\n")
    with pytest.raises(TraceError, match=r":1: header lacks column\(s\) input_tokens"):
        read_csv(path, NAMES)


def test_write_then_read_gives_the_same_trace(tmp_path: Path) -> None:
    spec = GeneratorSpec(duration_seconds=600, mean_rate_per_second=2, zipf_alpha=1.0, seed=3)
    trace = generate(spec, 2)
    write_csv(trace, NAMES, tmp_path / "t.csv")
    back = read_csv(tmp_path / "t.csv", NAMES)
    assert back.model_index == trace.model_index
    assert back.output_tokens == trace.output_tokens
    origin = trace.arrival_seconds[0]
    assert back.arrival_seconds == pytest.approx(
        [t - origin for t in trace.arrival_seconds], abs=1e-5
    )


def test_zipf_shares_follow_rank_over_a_seeded_shuffle() -> None:
    shares = zipf_shares(1.0, 48, seed=14)
    assert sum(shares) == pytest.approx(1.0)
    ranked = sorted(shares, reverse=True)
    assert ranked[0] / ranked[1] == pytest.approx(2.0)
    assert ranked[0] / ranked[47] == pytest.approx(48.0)
    assert shares == zipf_shares(1.0, 48, seed=14)
    assert shares != zipf_shares(1.0, 48, seed=15)  # the shuffle is the seed's
    assert zipf_shares(0.0, 4, seed=1) == [0.25] * 4


def test_gamma_inter_arrivals_have_the_rate_and_cv_asked_for() -> None:
    rng = random.Random(7)
    for cv in (1.0, 4.0):
        arrivals = gamma_arrivals(10.0, cv, 20_000.0, rng)
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert len(arrivals) / 20_000.0 == pytest.approx(10.0, rel=0.1)
        assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)


def test_lognormal_tokens_have_the_mean_asked_for() -> None:
    tokens = lognormal_tokens(100_000, 200.0, 1.0, random.Random(5))
    assert statistics.fmean(tokens) == pytest.approx(200.0, rel=0.03)
    assert min(tokens) >= 1


def test_generated_rate_share_and_diurnal_swing() -> None:
    spec = GeneratorSpec(
        duration_seconds=86_400,
        mean_rate_per_second=2.0,
        zipf_alpha=1.0,
        inter_arrival_cv=1.0,
        diurnal_peak_to_trough=3.0,
        seed=11,
    )
    trace = generate(spec, 4)
    assert len(trace) / 86_400 == pytest.approx(2.0, rel=0.03)
    assert trace.arrival_seconds == sorted(trace.arrival_seconds)
    shares = zipf_shares(1.0, 4, seed=11)
    top = max(range(4), key=shares.__getitem__)
    assert trace.model_index.count(top) / len(trace) == pytest.approx(shares[top], rel=0.05)
    # the trough is at midnight, the peak at noon: the hours around them differ 3:1
    trough = sum(1 for t in trace.arrival_seconds if t < 1800 or t >= 84_600)
    peak = sum(1 for t in trace.arrival_seconds if 41_400 <= t < 45_000)
    assert peak / trough == pytest.approx(3.0, rel=0.1)
    assert not math.isnan(trace.duration_seconds)
