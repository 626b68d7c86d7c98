"""`make bench-sim` / `make bench-grid`: `modelswap simulate` on the reference scenario.

    python -m bench.sim            the reference scenario (bench/scenarios/ref-h100.yaml):
                                   every policy's fewest GPUs meeting p99 added latency
                                   <= 1 s -> bench/results/<machine-class>/sim.json and a
                                   plot, docs/img/sim-ref-h100.png
    python -m bench.sim --grid     the sensitivity grid (zipf alpha x link x rate, the
                                   scenario's `grid:`), two cells at a time
                                   -> bench/results/<machine-class>/sim-grid.json

The verdict against issue 14's target is computed here, never typed: modelswap (the
better of its policies) meets the target with at most 8 GPUs and with fewer GPUs than
every baseline. Pure Python, no GPU; the figures are simulated, not measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

from bench import results_schema
from modelswap_sidecar.simulate import report, traces
from modelswap_sidecar.simulate.report import PolicyOutcome
from modelswap_sidecar.simulate.scenario import Scenario, load
from modelswap_sidecar.simulate.study import Study

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "bench" / "scenarios" / "ref-h100.yaml"
PLOT = ROOT / "docs" / "img" / "sim-ref-h100.png"
COMMAND = "make bench-sim (python -m bench.sim)"
GRID_COMMAND = "make bench-grid (python -m bench.sim --grid)"
#: issue 14: modelswap meets the target with at most this many GPUs
TARGET_MAX_GPUS = 8


def verdict(outcomes: list[PolicyOutcome]) -> dict[str, Any]:
    """Issue 14's target: the best modelswap policy meets p99 <= target with <= 8 GPUs and
    with fewer GPUs than every baseline (a baseline that never meets it counts as more)."""
    ours = [o for o in outcomes if o.kind == "modelswap" and o.fewest_gpus is not None]
    best = min(ours, key=lambda o: o.fewest_gpus or 0, default=None)
    baselines = {o.policy: o.fewest_gpus for o in outcomes if o.kind != "modelswap"}
    fewest = None if best is None else best.fewest_gpus
    beats_all = fewest is not None and all(b is None or fewest < b for b in baselines.values())
    within = fewest is not None and fewest <= TARGET_MAX_GPUS
    return {
        "modelswap_policy": None if best is None else best.policy,
        "modelswap_fewest_gpus": fewest,
        "baselines_fewest_gpus": baselines,
        "at_most_8_gpus": within,
        "fewer_than_every_baseline": beats_all,
        "met": within and beats_all,
    }


def _result(outcome: PolicyOutcome) -> dict[str, Any]:
    best = report.at_fewest(outcome)
    metrics: dict[str, Any] = {}
    if best is not None:
        metrics = {
            "p50_added_seconds": best.p50_added_seconds,
            "p99_added_seconds": best.p99_added_seconds,
            "p99_wait_seconds": best.p99_wait_seconds,
            "waited_share": best.waited_share,
            "swaps_per_hour": best.swaps_per_hour,
            "gpu_hours": best.gpu_hours,
            "slot_utilisation": best.slot_utilisation,
        }
    curve = [
        {
            "gpus": r.gpus,
            "p99_added_seconds": _finite(r.p99_added_seconds),
            "p99_wait_seconds": _finite(r.p99_wait_seconds),
            "swaps_per_hour": r.swaps_per_hour,
            "simulated_requests_per_second": r.simulated_requests_per_second,
        }
        for r in outcome.runs
    ]
    fewest = outcome.fewest_gpus
    return {
        "name": outcome.policy,
        "params": {"kind": outcome.kind, "runs": curve},
        "unit": "gpus",
        "samples": [] if fewest is None else [fewest],
        "median": fewest,
        "metrics": metrics,
    }


def _finite(value: float) -> float | None:
    return value if value != float("inf") else None


def study_of(scenario: Scenario) -> tuple[Study, float]:
    assert scenario.generator is not None
    started = time.perf_counter()
    trace = traces.generate(scenario.generator, len(scenario.models))
    return Study(scenario, trace), time.perf_counter() - started


def _progress(summary: report.RunSummary) -> None:
    print(
        f"  {summary.policy}: {summary.gpus} GPUs, p99 added "
        f"{report.seconds_text(summary.p99_added_seconds)} "
        f"({summary.wall_seconds:.1f} s, {summary.simulated_requests_per_second:,.0f} req/s)",
        flush=True,
    )


def reference() -> int:
    scenario = load(SCENARIO)
    study, generate_seconds = study_of(scenario)
    requests = len(study.trace)
    print(f"{scenario.name}: {requests:,} requests generated in {generate_seconds:.1f} s")
    started = time.perf_counter()
    outcomes = [study.fewest_gpus(spec, _progress) for spec in scenario.policies]
    wall = time.perf_counter() - started
    runs = [r for o in outcomes for r in o.runs]
    simulated = sum(r.requests for r in runs)
    speed = simulated / sum(r.wall_seconds for r in runs)
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    plotted = report.plot(PLOT, outcomes, scenario.target_p99_seconds, scenario.name)
    judged = verdict(outcomes)
    floor = study.reference_summary
    slots = compute_floor(study, scenario, judged["modelswap_policy"])
    over = over_budget(study, scenario, judged["modelswap_policy"])
    notes = [
        f"Scenario {SCENARIO.relative_to(ROOT)}: {len(scenario.models)} models, "
        f"{requests:,} requests over {study.trace.duration_seconds / 3600:.0f} h (seed "
        f"{scenario.generator.seed if scenario.generator else '-'}); target p99 added latency "
        f"<= {scenario.target_p99_seconds:g} s.",
        "Added latency = a request's wait (for its model to come in and for a compute slot) "
        "minus its wait in the dedicated run of the same trace; see docs/SIMULATE.md.",
        (
            f"The dedicated run's own p99 wait is {report.seconds_text(floor.p99_wait_seconds)}"
            f" ({floor.waited_share:.1%} of requests wait): the hottest model needs more than "
            "one GPU's concurrent requests at the diurnal peak, and a model lives on one GPU."
            if floor is not None
            else "no dedicated run"
        ),
        (
            f"Compute floor at {TARGET_MAX_GPUS} GPUs: with HBM for every model at once (the "
            "same placement, nothing swapped), sharing compute slots alone gives p99 added "
            f"latency {report.seconds_text(slots.p99_added_seconds)} "
            f"({slots.waited_share:.1%} of requests wait longer than dedicated), before any "
            "swap."
            if slots is not None
            else f"no compute floor: the models cannot be placed on {TARGET_MAX_GPUS} GPUs"
        ),
        (
            "Working set: share of requests arriving while the models of their GPU with a "
            "request waiting or in flight (the dedicated run's timing, their own model "
            "included) need more HBM than that GPU has for models, on the same placement: "
            + ", ".join(f"{share:.2%} at {gpus} GPUs" for gpus, share, _ in over)
            + ". At such a moment some request on that GPU waits for another model's "
            "requests to end, whatever the policy (none stops a request mid-way). With "
            "all GPUs pooled into one (what no placement beats): "
            + ", ".join(f"{pooled:.2%} at {gpus}" for gpus, _, pooled in over)
            + "."
            if over
            else "no working-set figure: no modelswap policy"
        ),
        f"Simulator speed: {speed:,.0f} simulated requests/s over {len(runs)} runs "
        f"({simulated:,} requests in {wall:.0f} s; trace generation {generate_seconds:.1f} s).",
    ]
    path = results_schema.write(
        "sim", COMMAND, [_result(o) for o in outcomes], notes, backend="none", scaled=False
    )
    doc = json.loads(path.read_text())
    doc["verdict"] = judged
    doc["target"] = {
        "p99_added_seconds": scenario.target_p99_seconds,
        "max_gpus": TARGET_MAX_GPUS,
    }
    doc["simulated_requests_per_second"] = speed
    if slots is not None:
        doc["compute_floor"] = {
            "gpus": slots.gpus,
            "policy": slots.policy,
            "p99_added_seconds": _finite(slots.p99_added_seconds),
        }
    if over:
        doc["over_budget_arrivals"] = [
            {"gpus": g, "share": share, "pooled_share": pooled} for g, share, pooled in over
        ]
    if plotted:
        doc["plot"] = str(PLOT.relative_to(ROOT / "docs"))
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print("\n".join(report.outcome_table(outcomes, scenario.target_p99_seconds)))
    print(f"verdict: {judged}")
    print(f"wrote {path.relative_to(ROOT)}" + (f", {PLOT.relative_to(ROOT)}" if plotted else ""))
    return 0


def compute_floor(study: Study, scenario: Scenario, policy: str | None) -> report.RunSummary | None:
    """The target's GPU count with every model resident all along (Study.compute_floor):
    the added latency that sharing compute slots alone causes on the simulator's placement
    with that many GPUs, before any swap."""
    specs = [p for p in scenario.policies if p.kind == "modelswap"]
    spec = next((p for p in specs if p.name == policy), specs[0] if specs else None)
    if spec is None:
        return None
    result = study.compute_floor(spec, TARGET_MAX_GPUS)
    if result is None:
        return None
    return report.summarize(result, scenario.target_p99_seconds, study.reference())


def over_budget(
    study: Study, scenario: Scenario, policy: str | None
) -> list[tuple[int, float, float]]:
    """(GPUs, share of over-budget arrivals on the simulator's placement, the same with
    all GPUs pooled: Study.over_budget_arrivals) at the target's GPU count and the two
    above it."""
    specs = [p for p in scenario.policies if p.kind == "modelswap"]
    spec = next((p for p in specs if p.name == policy), specs[0] if specs else None)
    if spec is None:
        return []
    out = []
    for gpus in range(TARGET_MAX_GPUS, TARGET_MAX_GPUS + 3):
        share = study.over_budget_arrivals(spec, gpus)
        pooled = study.over_budget_arrivals(spec, gpus, pooled=True)
        if share is not None and pooled is not None:
            out.append((gpus, share, pooled))
    return out


def _grid_cell(cell: tuple[float, float, float]) -> dict[str, Any]:
    alpha, link, rate = cell
    scenario = load(SCENARIO).with_changes(
        zipf_alpha=alpha, host_to_device_gbps=link, mean_rate_per_second=rate
    )
    study, _ = study_of(scenario)
    started = time.perf_counter()
    outcomes = [study.fewest_gpus(spec) for spec in scenario.policies]
    wall = time.perf_counter() - started
    floor = study.reference_summary
    print(f"  cell alpha={alpha:g} link={link:g} rate={rate:g}: {wall:.0f} s", flush=True)
    return {
        "name": f"alpha={alpha:g} link={link:g}GB/s rate={rate:g}/s",
        "params": {
            "zipf_alpha": alpha,
            "host_to_device_gbps": link,
            "mean_rate_per_second": rate,
            "requests": len(study.trace),
            "dedicated_p99_wait_seconds": None if floor is None else floor.p99_wait_seconds,
        },
        "unit": "gpus",
        "samples": [],
        "median": None,
        "metrics": {o.policy: o.fewest_gpus for o in outcomes},
        "verdict": verdict(outcomes),
    }


def grid(workers: int) -> int:
    scenario = load(SCENARIO)
    axes = scenario.grid
    cells = list(
        itertools.product(
            axes.get("zipfAlpha", (1.0,)),
            axes.get("hostToDeviceGBps", (55.0,)),
            axes.get("meanRatePerSecond", (20.0,)),
        )
    )
    print(f"{len(cells)} cells, {workers} at a time")
    started = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        results = pool.map(_grid_cell, cells, chunksize=1)
    wall = time.perf_counter() - started
    notes = [
        f"Scenario {SCENARIO.relative_to(ROOT)} with zipf alpha x host->device link x mean "
        "rate changed, all else as in the reference; each cell: every policy's fewest GPUs "
        f"meeting p99 added latency <= {scenario.target_p99_seconds:g} s (empty: none up to "
        f"{scenario.max_gpus}).",
        f"{len(cells)} cells in {wall:.0f} s, {workers} processes.",
    ]
    path = results_schema.write(
        "sim-grid", GRID_COMMAND, results, notes, backend="none", scaled=False
    )
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--grid", action="store_true", help="run the sensitivity grid")
    parser.add_argument("--workers", type=int, default=2, help="grid cells at a time")
    args = parser.parse_args(argv)
    return grid(args.workers) if args.grid else reference()


if __name__ == "__main__":
    sys.exit(main())
