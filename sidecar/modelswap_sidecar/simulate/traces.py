"""Request traces: read from CSV, written back, or generated.

A trace is four parallel lists sorted by arrival (`arrival_seconds`, `model_index` into
the catalogue, `input_tokens`, `output_tokens`); lists rather than per-request objects,
because a day at 20 requests/s is 1.7 million of them.

CSV: a header naming `timestamp`, `model`, `input_tokens`, `output_tokens` (any order,
other columns ignored); timestamps in seconds (any origin; the trace starts at its first);
rows need not be sorted. A bad row is refused naming its line and column.

The generator (issue 14): Zipf popularity with exponent `zipf_alpha`
over a seeded shuffle of the models; per model a renewal process with gamma inter-arrivals
of coefficient of variation `inter_arrival_cv` (1: Poisson; 4: bursts); a diurnal rate
swing `peak_to_trough` applied by warping time, so each model keeps its burstiness and
its share; lognormal output (and input) tokens with the given mean and log-sigma.
"""

from __future__ import annotations

import bisect
import csv
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from modelswap_sidecar.simulate.errors import ScenarioError, TraceError

COLUMNS = ("timestamp", "model", "input_tokens", "output_tokens")
DAY_SECONDS = 86_400.0


@dataclass(frozen=True, kw_only=True)
class Trace:
    arrival_seconds: list[float]
    model_index: list[int]
    input_tokens: list[int]
    output_tokens: list[int]
    duration_seconds: float

    def __len__(self) -> int:
        return len(self.arrival_seconds)


@dataclass(frozen=True, kw_only=True)
class GeneratorSpec:
    duration_seconds: float
    mean_rate_per_second: float
    zipf_alpha: float
    inter_arrival_cv: float = 1.0
    #: peak rate / trough rate over a day (1: flat)
    diurnal_peak_to_trough: float = 1.0
    output_tokens_mean: float = 200.0
    output_tokens_sigma: float = 1.0
    input_tokens_mean: float = 500.0
    input_tokens_sigma: float = 1.0
    seed: int = 1

    def __post_init__(self) -> None:
        positive = ("duration_seconds", "mean_rate_per_second", "inter_arrival_cv",
                    "output_tokens_mean", "input_tokens_mean")  # fmt: skip
        for name in positive:
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ScenarioError(f"trace.generator.{name} must be positive")
        if not (self.zipf_alpha >= 0 and math.isfinite(self.zipf_alpha)):
            raise ScenarioError("trace.generator.zipf_alpha must be 0 or more")
        if not self.diurnal_peak_to_trough >= 1:
            raise ScenarioError("trace.generator.diurnal_peak_to_trough must be at least 1")
        for name in ("output_tokens_sigma", "input_tokens_sigma"):
            if not getattr(self, name) >= 0:
                raise ScenarioError(f"trace.generator.{name} must be 0 or more")


# -- generator ------------------------------------------------------------------------------


def zipf_shares(alpha: float, models: int, seed: int) -> list[float]:
    """Each model's share of requests: rank r gets r**-alpha (normalised); ranks are dealt
    to models by a shuffle seeded with `seed`, so popularity does not follow the
    catalogue's order (sizes are grouped there)."""
    weights = [(rank + 1) ** -alpha for rank in range(models)]
    total = sum(weights)
    order = list(range(models))
    random.Random(seed).shuffle(order)
    shares = [0.0] * models
    for rank, model in enumerate(order):
        shares[model] = weights[rank] / total
    return shares


def diurnal_warp(peak_to_trough: float, duration_seconds: float) -> Callable[[float], float]:
    """Maps "operational" time (a constant mean rate) to real time with rate
    mean * (1 - a*cos(2*pi*t/day)), a = (r-1)/(r+1): the trough at t=0, the peak at noon.

    Arrivals generated at the mean rate in operational time land, after the warp, at the
    swinging rate. The cumulative rate is tabulated every 10 s and inverted by bisection.
    """
    a = (peak_to_trough - 1) / (peak_to_trough + 1)
    if a == 0:
        return lambda u: u
    step = 10.0
    omega = 2 * math.pi / DAY_SECONDS
    grid = [i * step for i in range(int(duration_seconds / step) + 2)]
    cumulative = [t - a / omega * math.sin(omega * t) for t in grid]

    def warp(u: float) -> float:
        i = bisect.bisect_right(cumulative, u) - 1
        i = min(max(i, 0), len(grid) - 2)
        low, high = cumulative[i], cumulative[i + 1]
        return grid[i] + step * (u - low) / (high - low)

    return warp


def operational_horizon(peak_to_trough: float, duration_seconds: float) -> float:
    """Operational time that the warp maps onto `duration_seconds` of real time."""
    a = (peak_to_trough - 1) / (peak_to_trough + 1)
    omega = 2 * math.pi / DAY_SECONDS
    return duration_seconds - a / omega * math.sin(omega * duration_seconds)


def gamma_arrivals(
    rate_per_second: float, cv: float, horizon_seconds: float, rng: random.Random
) -> list[float]:
    """A renewal process on [0, horizon): gamma inter-arrivals with mean 1/rate and
    coefficient of variation `cv`, starting at a random phase of its first interval."""
    if rate_per_second <= 0:
        return []
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate_per_second * shape)
    gamma = rng.gammavariate
    t = gamma(shape, scale) * rng.random()
    out = []
    while t < horizon_seconds:
        out.append(t)
        t += gamma(shape, scale)
    return out


def lognormal_tokens(count: int, mean: float, sigma: float, rng: random.Random) -> list[int]:
    """`count` token counts, lognormal with the given mean and log-sigma, at least 1."""
    mu = math.log(mean) - sigma * sigma / 2
    draw = rng.lognormvariate
    return [max(1, round(draw(mu, sigma))) for _ in range(count)]


def generate(spec: GeneratorSpec, models: int) -> Trace:
    """A seeded trace over `models` models: the same spec always gives the same trace."""
    rng = random.Random(spec.seed)
    shares = zipf_shares(spec.zipf_alpha, models, spec.seed)
    horizon = operational_horizon(spec.diurnal_peak_to_trough, spec.duration_seconds)
    warp = diurnal_warp(spec.diurnal_peak_to_trough, spec.duration_seconds)
    times: list[float] = []
    owners: list[int] = []
    for model, share in enumerate(shares):
        arrivals = gamma_arrivals(
            spec.mean_rate_per_second * share, spec.inter_arrival_cv, horizon, rng
        )
        times.extend(warp(u) for u in arrivals)
        owners.extend([model] * len(arrivals))
    order = sorted(range(len(times)), key=times.__getitem__)
    count = len(order)
    return Trace(
        arrival_seconds=[times[i] for i in order],
        model_index=[owners[i] for i in order],
        input_tokens=lognormal_tokens(count, spec.input_tokens_mean, spec.input_tokens_sigma, rng),
        output_tokens=lognormal_tokens(
            count, spec.output_tokens_mean, spec.output_tokens_sigma, rng
        ),
        duration_seconds=spec.duration_seconds,
    )


# -- CSV ------------------------------------------------------------------------------------


def read_csv(path: Path, model_names: Sequence[str]) -> Trace:
    """The trace in `path`; TraceError naming the line and column of the first bad row."""
    index = {name: i for i, name in enumerate(model_names)}
    rows: list[tuple[float, int, int, int]] = []
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{path}: empty file (expected a header: {', '.join(COLUMNS)})")
            columns = [h.strip() for h in header]
            missing = [c for c in COLUMNS if c not in columns]
            if missing:
                raise TraceError(f"{path}:1: header lacks column(s) {', '.join(missing)}")
            at = {c: columns.index(c) for c in COLUMNS}
            for row in reader:
                line = reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) < len(columns):
                    raise TraceError(
                        f"{path}:{line}: {len(row)} columns, the header has {len(columns)}"
                    )
                rows.append(_row(path, line, row, at, index))
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text ({e.reason})") from e
    except csv.Error as e:
        raise TraceError(f"{path}: cannot read CSV: {e}") from e
    if not rows:
        raise TraceError(f"{path}: no requests")
    rows.sort(key=lambda r: r[0])
    origin = rows[0][0]
    arrivals = [r[0] - origin for r in rows]
    return Trace(
        arrival_seconds=arrivals,
        model_index=[r[1] for r in rows],
        input_tokens=[r[2] for r in rows],
        output_tokens=[r[3] for r in rows],
        duration_seconds=max(arrivals[-1], 1.0),
    )


def _row(
    path: Path, line: int, row: list[str], at: dict[str, int], index: dict[str, int]
) -> tuple[float, int, int, int]:
    def bad(column: str, why: str) -> TraceError:
        return TraceError(f"{path}:{line}: column {column}: {row[at[column]]!r} {why}")

    try:
        timestamp = float(row[at["timestamp"]])
    except ValueError:
        raise bad("timestamp", "is not a number of seconds") from None
    if not math.isfinite(timestamp):
        raise bad("timestamp", "is not a finite number of seconds")
    model = index.get(row[at["model"]].strip())
    if model is None:
        raise bad("model", "is not a model of the catalogue")
    tokens = []
    for column in ("input_tokens", "output_tokens"):
        text = row[at[column]].strip()
        if not text.isdigit():
            raise bad(column, "is not a whole number of tokens")
        tokens.append(int(text))
    if tokens[1] < 1:
        raise bad("output_tokens", "must be at least 1")
    return timestamp, model, tokens[0], tokens[1]


def write_csv(trace: Trace, model_names: Sequence[str], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for t, m, i, o in zip(
            trace.arrival_seconds,
            trace.model_index,
            trace.input_tokens,
            trace.output_tokens,
            strict=True,
        ):
            writer.writerow((f"{t:.6f}", model_names[m], i, o))
