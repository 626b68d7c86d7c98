"""`modelswap simulate` end to end on tiny scenarios, the scenario file's refusals, and
`make bench-sim`'s verdict and rendering."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from bench import render, results_schema
from bench.sim import verdict
from modelswap_api.cli import main
from modelswap_sidecar.simulate.catalogue import resolve_policies
from modelswap_sidecar.simulate.errors import ScenarioError
from modelswap_sidecar.simulate.report import PolicyOutcome, RunSummary
from modelswap_sidecar.simulate.scenario import load
from modelswap_sidecar.simulate.study import Study
from modelswap_sidecar.simulate.traces import Trace

pytestmark = pytest.mark.timeout(60)

SCENARIO = """
name: tiny
gpu:
  hbmBytes: 30G
  reserveBytes: 1G
  perProcessOverheadBytes: 500M
  hostStoreBytes: 100G
  hostToDeviceGBps: 10
  deviceToHostGBps: 10
  coldLoadGBps: 2
  coldStartSeconds: 5
  concurrentRequests: 8
models:
  - {name: small, count: 3, weightsBytes: 4G, perTokenSeconds: 0.005}
  - {name: big, count: 2, weightsBytes: 12G, perTokenSeconds: 0.02}
trace:
  generator:
    durationSeconds: 1800
    meanRatePerSecond: 2
    zipfAlpha: 1.0
    interArrivalCv: 2
    outputTokensMean: 50
    seed: 3
target: {p99AddedSeconds: 1.0}
policies:
  - {name: modelswap-default, kind: modelswap}
  - {name: dedicated, kind: dedicated}
  - {name: lru, kind: lru}
"""


def scenario_file(tmp_path: Path, text: str = SCENARIO) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_searches_the_fewest_gpus_and_writes_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["simulate", str(scenario_file(tmp_path)), "--out", str(out)]) == 0
    fewest = {r["policy"]: r for r in rows(out / "fewest.csv")}
    assert set(fewest) == {"modelswap-default", "dedicated", "lru"}
    assert fewest["dedicated"]["fewest_gpus"] == "5"
    runs = rows(out / "runs.csv")
    assert {"p50_added_seconds", "p99_added_seconds", "waited_share", "swaps_per_hour",
            "gpu_hours", "simulated_requests_per_second"} <= set(runs[0])  # fmt: skip
    for policy in ("modelswap-default", "lru"):
        counts = sorted(int(r["gpus"]) for r in runs if r["policy"] == policy)
        found = int(fewest[policy]["fewest_gpus"])
        met = {int(r["gpus"]): r["meets_target"] == "True" for r in runs if r["policy"] == policy}
        assert met[found] and (found - 1 not in met or not met[found - 1]), counts
    text = capsys.readouterr().out
    assert "| policy | fewest GPUs (p99 <= 1.00 s)" in text
    assert "simulated requests in" in text


def test_fixed_gpu_counts_and_a_csv_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "timestamp,model,input_tokens,output_tokens\n"
        "0,big-00,10,100\n0.5,big-01,10,100\n1,small-00,10,100\n"
    )
    out = tmp_path / "out"
    argv = ["simulate", str(scenario_file(tmp_path)), "--trace", str(trace), "--gpus", "1",
            "--policy", "modelswap-default", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    (run,) = rows(out / "runs.csv")
    # one GPU of 30G - 1G - 5 x 500M = 26.5G: both big models resident (the most load),
    # small-00 out. Its request at t=1 finds both busy: it waits for the first to become
    # idle (big-00, at t=2), which swaps out (0.02 s), then small-00 swaps in: 0.05 s + 4G
    # at 10 GB/s
    assert (run["gpus"], run["requests"], run["swap_ins"], run["swap_outs"]) == ("1", "3", "1", "1")
    assert float(run["max_added_seconds"]) == pytest.approx(1.0 + 0.02 + 0.05 + 0.4)


def test_the_compute_floor_keeps_every_model_resident_on_the_same_placement(
    tmp_path: Path,
) -> None:
    # one slot on one GPU that holds two of the three models: the floor swaps nothing and
    # its waits are for the slot alone (big-00 holds it 0-2 s, big-01 2-4 s)
    text = SCENARIO.replace("concurrentRequests: 8", "concurrentRequests: 1")
    scenario = load(scenario_file(tmp_path, text))
    requests = Trace(
        arrival_seconds=[0.0, 0.5, 1.0],
        model_index=[3, 4, 0],  # big-00, big-01, small-00
        input_tokens=[0, 0, 0],
        output_tokens=[100, 100, 100],
        duration_seconds=60.0,
    )
    study = Study(scenario, requests)
    (spec,) = (p for p in scenario.policies if p.name == "modelswap-default")
    swapped = study.run(spec, 1)
    floor = study.compute_floor(spec, 1)
    assert swapped is not None and floor is not None
    assert swapped.swap_ins == 1
    assert (floor.swap_ins, floor.swap_outs, floor.cold_loads) == (0, 0, 0)
    assert dict(zip(floor.waited_requests, floor.waits_seconds, strict=True)) == {
        1: pytest.approx(1.5),
        2: pytest.approx(3.0),
    }


def test_over_budget_arrivals_count_requests_whose_gpus_busy_models_do_not_fit(
    tmp_path: Path,
) -> None:
    # on one GPU (budget 30G - 1G - 5 x 500M = 26.5G) small-00 arrives while big-00 and
    # big-01 serve: 12G + 12G + 4G busy; on two GPUs the bigs are apart
    scenario = load(scenario_file(tmp_path))
    requests = Trace(
        arrival_seconds=[0.0, 0.5, 1.0],
        model_index=[3, 4, 0],  # big-00 (0-2 s), big-01 (0.5-2.5 s), small-00
        input_tokens=[0, 0, 0],
        output_tokens=[100, 100, 100],
        duration_seconds=60.0,
    )
    study = Study(scenario, requests)
    (spec,) = (p for p in scenario.policies if p.name == "modelswap-default")
    assert study.over_budget_arrivals(spec, 1) == pytest.approx(1 / 3)
    assert study.over_budget_arrivals(spec, 2) == 0.0
    # pooled, two GPUs hold 2 x 27.5G - 2.5G: the three busy models fit
    assert study.over_budget_arrivals(spec, 2, pooled=True) == 0.0


def test_a_bad_trace_row_exits_2_naming_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,model,input_tokens,output_tokens\n0,big-00,10,100\n1,nope,1,1\n")
    assert main(["simulate", str(scenario_file(tmp_path)), "--trace", str(trace)]) == 2
    assert f"{trace}:3: column model: 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("hostToDeviceGBps: 10", "hostToDeviceGBps: fast"),
            "gpu.hostToDeviceGBps must be a number",
        ),
        (("hbmBytes: 30G", "hbmBytes: 30 gigs"), "gpu.hbmBytes:"),
        (("kind: lru", "kind: fifo"), "policies[2].kind must be one of"),
        (("seed: 3", "seed: 3\n    burst: 2"), "trace.generator.burst: unknown field"),
        (
            ("count: 3, ", "count: 3, swapPolicy: {idleAfter: 1m, minResident: 5m}, "),
            "model small-00",
        ),
    ],
)
def test_a_bad_scenario_is_refused_naming_the_field(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = scenario_file(tmp_path, SCENARIO.replace(*change))
    with pytest.raises(ScenarioError) as e:
        scenario = load(path)
        # policy fields are merged over the defaults when a run needs them
        resolve_policies(scenario.models, scenario.policies[0].overrides)
    assert message in str(e.value)


def test_the_reference_scenario_is_as_issue_14_states() -> None:
    scenario = load(Path(__file__).resolve().parents[2] / "bench/scenarios/ref-h100.yaml")
    sizes = sorted({(m.weights_bytes, m.per_output_token_seconds) for m in scenario.models})
    assert sizes == [(3 * 10**9, 0.008), (16 * 10**9, 0.02), (28 * 10**9, 0.03), (40 * 10**9, 0.04)]
    counts = [sum(m.weights_bytes == s for m in scenario.models) for s, _ in sizes]
    assert counts == [16, 20, 8, 4]
    gpu, gen = scenario.gpu, scenario.generator
    assert gen is not None
    assert (gpu.host_to_device_bytes_per_second, gpu.device_to_host_bytes_per_second) == (
        55e9,
        57e9,
    )
    assert (gpu.reserve_bytes, gpu.per_process_overhead_bytes) == (2 << 30, 512 << 20)
    assert (gpu.host_store_bytes, gpu.cold_load_bytes_per_second) == (240 * 10**9, 2e9)
    assert (gpu.cold_start_seconds, gpu.concurrent_requests) == (5.0, 32)
    assert (gen.duration_seconds, gen.mean_rate_per_second, gen.diurnal_peak_to_trough) == (
        86400,
        20,
        3,
    )
    assert (gen.zipf_alpha, gen.inter_arrival_cv, gen.output_tokens_mean) == (1.0, 4, 200)
    assert scenario.grid == {
        "zipfAlpha": (0.6, 1.0, 1.4),
        "hostToDeviceGBps": (55, 350),
        "meanRatePerSecond": (10, 20, 40),
    }
    kinds = {p.kind for p in scenario.policies}
    assert kinds == {"modelswap", "dedicated", "keepalive", "lru", "sleepwake"}


def outcome(policy: str, kind: str, fewest: int | None) -> PolicyOutcome:
    runs: tuple[RunSummary, ...] = ()
    if fewest is not None:
        summary: dict[str, Any] = dict.fromkeys(RunSummary.__dataclass_fields__, 0.0)
        summary.update(policy=policy, gpus=fewest, meets_target=True)
        runs = (RunSummary(**summary),)
    return PolicyOutcome(policy=policy, kind=kind, runs=runs, fewest_gpus=fewest)


def test_the_verdict_needs_at_most_8_gpus_and_fewer_than_every_baseline() -> None:
    base = [outcome("dedicated", "dedicated", 48), outcome("lru", "lru", 12)]
    assert verdict([outcome("ms", "modelswap", 8), *base])["met"]
    missed = verdict([outcome("ms", "modelswap", 11), *base])
    assert not missed["met"] and not missed["at_most_8_gpus"]
    assert missed["fewer_than_every_baseline"]
    tie = verdict([outcome("ms", "modelswap", 8), outcome("sw", "sleepwake", 8)])
    assert not tie["met"] and not tie["fewer_than_every_baseline"]
    never = verdict([outcome("ms", "modelswap", 6), outcome("ka", "keepalive", None)])
    assert never["met"]


def test_sim_results_render_with_their_verdict() -> None:
    doc: dict[str, Any] = {
        "schema": results_schema.SCHEMA,
        "bench": "sim",
        "command": "make bench-sim (python -m bench.sim)",
        "machine_class": "cpu-2cpu-nogpu",
        "machine": {"cpu_model": "CPU", "cpus": 2, "memory_bytes": 2**34, "gpu": "none"},
        "git_commit": "0" * 40,
        "recorded_at": "2026-01-01T00:00:00Z",
        "backend": "none",
        "scaled": False,
        "scaled_target_bytes_per_second": None,
        "notes": ["a note"],
        "results": [
            {
                "name": "modelswap-tuned",
                "params": {"kind": "modelswap", "runs": [{"gpus": 10, "p99_added_seconds": 2.5},
                                                         {"gpus": 11, "p99_added_seconds": 0.5}]},
                "unit": "gpus", "samples": [11], "median": 11,
                "metrics": {"p50_added_seconds": 0.0, "p99_added_seconds": 0.5,
                            "p99_wait_seconds": 9.5, "waited_share": 0.03,
                            "swaps_per_hour": 289.0, "gpu_hours": 264.0},
            },
            {"name": "lru", "params": {"kind": "lru", "runs": [{"gpus": 48, "p99_added_seconds": None}]},
             "unit": "gpus", "samples": [], "median": None, "metrics": {}},
        ],
        "verdict": {"modelswap_policy": "modelswap-tuned", "modelswap_fewest_gpus": 11,
                    "baselines_fewest_gpus": {"lru": None}, "at_most_8_gpus": False,
                    "fewer_than_every_baseline": True, "met": False},
        "target": {"p99_added_seconds": 1.0, "max_gpus": 8},
    }  # fmt: skip
    page = render.render([doc])
    row = next(line for line in page.splitlines() if line.startswith("| modelswap-tuned"))
    assert "| 11 | 0 ms | 500 ms | 9.50 s | 3.0% | 289 | 264 | 10: 2.50 s, 11: 500 ms |" in row
    assert "| lru | none |" in page and "48: never served" in page
    assert "**Verdict: MISSED** (at most 8 GPUs: no; fewer than every baseline: yes)" in page
