"""`modelswap simulate`: how many GPUs a model catalogue needs under each policy.

    modelswap simulate SCENARIO.yaml [--trace CSV] [--policy NAME ...] [--gpus N ...]
        [--target-p99-seconds S] [--duration-seconds S] [--rate R] [--zipf-alpha A]
        [--link-gbps G] [--seed N] [--out DIR] [--write-trace CSV]

Runs the scenario's trace (its generator, or --trace) through each policy: with --gpus,
at those GPU counts; otherwise it searches for the fewest GPUs meeting the p99
added-latency target. Prints a table and writes DIR/runs.csv (every run),
DIR/fewest.csv (one row per policy) and, when matplotlib is installed, DIR/p99.png.
See docs/SIMULATE.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from modelswap_sidecar.simulate import report, traces
from modelswap_sidecar.simulate.errors import SimulateError
from modelswap_sidecar.simulate.report import PolicyOutcome
from modelswap_sidecar.simulate.scenario import PolicySpec, Scenario, load
from modelswap_sidecar.simulate.study import Study

EXIT_BAD_INPUT = 2


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="trace-driven what-if: GPUs needed and added latency per policy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario", type=Path, help="scenario YAML (see docs/SIMULATE.md)")
    parser.add_argument("--trace", type=Path, help="trace CSV instead of the scenario's trace")
    parser.add_argument(
        "--policy", action="append", metavar="NAME", help="only this policy (repeatable)"
    )
    parser.add_argument(
        "--gpus", type=int, action="append", metavar="N", help="run at N GPUs (repeatable)"
    )
    parser.add_argument("--target-p99-seconds", type=float, metavar="S")
    parser.add_argument("--duration-seconds", type=float, metavar="S", help="generator only")
    parser.add_argument("--rate", type=float, metavar="R", help="mean requests/s (generator)")
    parser.add_argument("--zipf-alpha", type=float, metavar="A", help="generator only")
    parser.add_argument("--link-gbps", type=float, metavar="G", help="host->device GB/s")
    parser.add_argument("--seed", type=int, help="generator seed")
    parser.add_argument("--out", type=Path, default=Path("simulate-out"), metavar="DIR")
    parser.add_argument("--write-trace", type=Path, metavar="CSV", help="save the trace used")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    try:
        scenario = _scenario(args)
        trace = _trace(scenario, args.trace)
    except (SimulateError, OSError) as e:
        print(f"modelswap simulate: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    names = [m.name for m in scenario.models]
    if args.write_trace:
        traces.write_csv(trace, names, args.write_trace)
    specs = scenario.policies
    if args.policy:
        unknown = sorted(set(args.policy) - {p.name for p in specs})
        if unknown:
            known = ", ".join(p.name for p in specs)
            print(
                f"modelswap simulate: unknown policy {unknown[0]} (have {known})", file=sys.stderr
            )
            return EXIT_BAD_INPUT
        specs = tuple(p for p in specs if p.name in args.policy)
    print(
        f"{scenario.name}: {len(trace):,} requests over {trace.duration_seconds / 3600:.1f} h, "
        f"{len(names)} models, target p99 added latency {scenario.target_p99_seconds:g} s"
    )
    study = Study(scenario, trace)
    started = time.perf_counter()
    outcomes = run_study(study, specs, args.gpus)
    wall = time.perf_counter() - started
    simulated = sum(r.requests for o in outcomes for r in o.runs)
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_runs_csv(
        args.out / "runs.csv", [r for o in outcomes for r in o.runs], scenario.name
    )
    report.write_outcomes_csv(args.out / "fewest.csv", outcomes, scenario.name)
    print()
    print("\n".join(report.outcome_table(outcomes, scenario.target_p99_seconds)))
    print()
    print(f"{simulated:,} simulated requests in {wall:.1f} s ({simulated / wall:,.0f}/s)")
    plotted = report.plot(
        args.out / "p99.png", outcomes, scenario.target_p99_seconds, scenario.name
    )
    print(f"wrote {args.out / 'runs.csv'}, {args.out / 'fewest.csv'}", end="")
    print(f", {args.out / 'p99.png'}" if plotted else " (no plot: matplotlib is not installed)")
    return 0


def run_study(
    study: Study, specs: Sequence[PolicySpec], gpu_counts: Sequence[int] | None
) -> list[PolicyOutcome]:
    """Each policy at `gpu_counts`, or searched for its fewest GPUs."""
    if not gpu_counts:
        return [study.fewest_gpus(spec, _progress) for spec in specs]
    out = []
    for spec in specs:
        runs = []
        for gpus in gpu_counts:
            result = study.run(spec, gpus)
            if result is None:
                print(f"  {spec.name}: {gpus} GPUs cannot hold these models")
                continue
            summary = report.summarize(result, study.scenario.target_p99_seconds, study.reference())
            _progress(summary)
            runs.append(summary)
        met = [r.gpus for r in runs if r.meets_target]
        out.append(
            PolicyOutcome(
                policy=spec.name,
                kind=spec.kind,
                runs=tuple(sorted(runs, key=lambda r: r.gpus)),
                fewest_gpus=min(met) if met else None,
            )
        )
    return out


def _progress(summary: report.RunSummary) -> None:
    print(
        f"  {summary.policy}: {summary.gpus} GPUs, p99 added "
        f"{report.seconds_text(summary.p99_added_seconds)}, "
        f"{summary.swaps_per_hour:.0f} swaps/h ({summary.wall_seconds:.1f} s)",
        flush=True,
    )


def _scenario(args: argparse.Namespace) -> Scenario:
    generator_args = (args.zipf_alpha, args.rate, args.duration_seconds, args.seed)
    if args.trace and any(v is not None for v in generator_args):
        raise SimulateError("--rate, --zipf-alpha, --duration-seconds and --seed change the "
                            "generator; they do not apply to --trace")  # fmt: skip
    scenario = load(args.scenario).with_changes(
        zipf_alpha=args.zipf_alpha,
        mean_rate_per_second=args.rate,
        host_to_device_gbps=args.link_gbps,
        duration_seconds=args.duration_seconds,
        seed=args.seed,
    )
    if args.target_p99_seconds is not None:
        scenario = replace(scenario, target_p99_seconds=args.target_p99_seconds)
    return scenario


def _trace(scenario: Scenario, csv_path: Path | None) -> traces.Trace:
    path = csv_path or scenario.trace_csv
    if path is not None:
        return traces.read_csv(path, [m.name for m in scenario.models])
    assert scenario.generator is not None  # a scenario has one or the other
    return traces.generate(scenario.generator, len(scenario.models))
