"""What a run says: added-latency percentiles, waits, swaps, GPU-hours; CSV and plots.

A request's wait is the time from its arrival until it gets a compute slot (for its model
to come in, and for a slot). Its *added latency* is its wait minus its wait in the
dedicated run of the same trace (one GPU per model, always resident), floored at 0: what
sharing GPUs and swapping add, as the gateway bench's added latency is what the gateway
adds to a direct request. Both are reported; the target is on the added latency.

Percentiles are nearest-rank over every request of the trace: requests that never waited
count as 0 s, requests never served (refused, or still waiting at the end) as infinite,
so a policy cannot look better by dropping requests.
"""

from __future__ import annotations

import csv
import math
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from modelswap_sidecar.simulate.engine import RunResult

HOUR_SECONDS = 3600.0


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    policy: str
    gpus: int
    requests: int
    p50_added_seconds: float
    p99_added_seconds: float
    p999_added_seconds: float
    max_added_seconds: float
    mean_added_seconds: float
    #: share of requests with any added latency
    waited_share: float
    #: the wait itself (not less the dedicated run's)
    p50_wait_seconds: float
    p99_wait_seconds: float
    unserved: int
    swap_ins: int
    cold_loads: int
    swap_outs: int
    swaps_per_hour: float
    gpu_hours: float
    slot_utilisation: float
    meets_target: bool
    wall_seconds: float
    simulated_requests_per_second: float


@dataclass(frozen=True, kw_only=True)
class PolicyOutcome:
    """One policy's runs of a study (`study.Study`), lowest GPU count first."""

    policy: str
    kind: str
    runs: tuple[RunSummary, ...]
    #: the fewest GPUs whose run met the target (None: none up to maxGpus did)
    fewest_gpus: int | None


def quantile(waits: Sequence[float], requests: int, unserved: int, q: float) -> float:
    """Nearest-rank quantile `q` of `requests` added latencies: `waits` are the positive
    ones (sorted ascending), `unserved` count as infinite, the rest as 0."""
    if requests <= 0:
        return 0.0
    rank = max(1, math.ceil(q * requests))  # 1-based
    zeros = requests - len(waits) - unserved
    if rank <= zeros:
        return 0.0
    if rank <= zeros + len(waits):
        return waits[rank - zeros - 1]
    return math.inf


def dense_waits(result: RunResult) -> array[float]:
    """Every request's wait, by trace index (infinite for unserved ones)."""
    waits = array("d", bytes(8 * result.requests))
    for k, w in zip(result.waited_requests, result.waits_seconds, strict=True):
        waits[k] = w
    for k in result.unserved_requests:
        waits[k] = math.inf
    return waits


def summarize(
    result: RunResult, target_p99_seconds: float, reference: Sequence[float] | None = None
) -> RunSummary:
    """`reference`: the dedicated run's `dense_waits` on the same trace (None: added
    latency is the wait itself, as for the dedicated run)."""
    waits = sorted(result.waits_seconds)
    if reference is None:
        added = [w for w in waits if w > 0]
    else:
        added = [
            d
            for k, w in zip(result.waited_requests, result.waits_seconds, strict=True)
            if (d := w - reference[k]) > 0
        ]
        added.sort()
    waits = [w for w in waits if w > 0]
    n, unserved = result.requests, len(result.unserved_requests)
    hours = result.duration_seconds / HOUR_SECONDS
    p99 = quantile(added, n, unserved, 0.99)
    served = n - unserved
    return RunSummary(
        policy=result.policy,
        gpus=result.gpus,
        requests=n,
        p50_added_seconds=quantile(added, n, unserved, 0.50),
        p99_added_seconds=p99,
        p999_added_seconds=quantile(added, n, unserved, 0.999),
        max_added_seconds=math.inf if unserved else (added[-1] if added else 0.0),
        mean_added_seconds=(sum(added) / served) if served else math.inf,
        waited_share=(len(added) + unserved) / n if n else 0.0,
        p50_wait_seconds=quantile(waits, n, unserved, 0.50),
        p99_wait_seconds=quantile(waits, n, unserved, 0.99),
        unserved=unserved,
        swap_ins=result.swap_ins,
        cold_loads=result.cold_loads,
        swap_outs=result.swap_outs,
        swaps_per_hour=(result.swap_ins + result.cold_loads) / hours if hours else 0.0,
        gpu_hours=result.gpus * hours,
        slot_utilisation=(
            result.busy_slot_seconds
            / (result.gpus * result.slots_per_gpu * result.duration_seconds)
            if result.duration_seconds
            else 0.0
        ),
        meets_target=p99 <= target_p99_seconds,
        wall_seconds=result.wall_seconds,
        simulated_requests_per_second=n / result.wall_seconds if result.wall_seconds else 0.0,
    )


# -- CSV and text --------------------------------------------------------------------------


CSV_FIELDS = tuple(f.name for f in fields(RunSummary))


def write_runs_csv(path: Path, runs: Sequence[RunSummary], scenario: str) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(("scenario", *CSV_FIELDS))
        for run in runs:
            row = asdict(run)
            writer.writerow((scenario, *(_csv_value(row[name]) for name in CSV_FIELDS)))


def write_outcomes_csv(path: Path, outcomes: Sequence[PolicyOutcome], scenario: str) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(
            ("scenario", "policy", "kind", "fewest_gpus", "p99_added_seconds", "gpu_hours")
        )
        for outcome in outcomes:
            best = at_fewest(outcome)
            writer.writerow(
                (
                    scenario,
                    outcome.policy,
                    outcome.kind,
                    "" if outcome.fewest_gpus is None else outcome.fewest_gpus,
                    "" if best is None else _csv_value(best.p99_added_seconds),
                    "" if best is None else _csv_value(best.gpu_hours),
                )
            )


def _csv_value(value: object) -> object:
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.6g}"
    return value


def at_fewest(outcome: PolicyOutcome) -> RunSummary | None:
    return next((r for r in outcome.runs if r.gpus == outcome.fewest_gpus), None)


def seconds_text(value: float) -> str:
    if math.isinf(value):
        return "never served"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1e3:.0f} ms"


def outcome_table(outcomes: Sequence[PolicyOutcome], target_seconds: float) -> list[str]:
    """A Markdown table: each policy's fewest GPUs meeting the target, and that run."""
    lines = [
        f"| policy | fewest GPUs (p99 <= {seconds_text(target_seconds)}) | p50 added | "
        "p99 added | waited | swaps/h | GPU-hours |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for outcome in outcomes:
        best = at_fewest(outcome)
        if best is None:
            tried = max(outcome.runs, key=lambda r: r.gpus, default=None)
            at = (
                f"none (at {tried.gpus}: p99 {seconds_text(tried.p99_added_seconds)})"
                if tried
                else "none"
            )
            lines.append(f"| {outcome.policy} | {at} | | | | | |")
            continue
        lines.append(
            f"| {outcome.policy} | {best.gpus} | {seconds_text(best.p50_added_seconds)} | "
            f"{seconds_text(best.p99_added_seconds)} | {best.waited_share:.1%} | "
            f"{best.swaps_per_hour:.0f} | {best.gpu_hours:.0f} |"
        )
    return lines


# -- plots ---------------------------------------------------------------------------------


def plot(path: Path, outcomes: Sequence[PolicyOutcome], target_seconds: float, title: str) -> bool:
    """p99 added latency against GPU count, one line per policy (PNG). False when
    matplotlib is not installed (it is optional: the `dev` extra has it)."""
    try:
        import matplotlib  # noqa: PLC0415 - optional, at use

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=110)
    ceiling = 0.0
    for outcome in outcomes:
        points = [(r.gpus, r.p99_added_seconds) for r in outcome.runs]
        finite = [p for p in points if math.isfinite(p[1])]
        ceiling = max([ceiling, *(p[1] for p in finite)])
        shown = [(g, s if math.isfinite(s) else math.nan) for g, s in points]
        axes.plot(
            [g for g, _ in shown],
            [max(s, 1e-3) for _, s in shown],
            marker="o",
            label=outcome.policy,
        )
    axes.axhline(target_seconds, color="grey", linestyle="--", linewidth=1, label="target")
    axes.set_yscale("log")
    axes.set_xlabel("GPUs")
    axes.set_ylabel("p99 added latency (s, log)")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True
