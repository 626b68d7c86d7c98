"""Tiny runs of the benches that start real processes: each finishes, checks every answer
it measures, writes no result file and leaves no process behind (its children run in
their own process groups)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _run(args: list[str], timeout: float) -> str:
    done = subprocess.run(
        [sys.executable, "-m", *args, "--no-results"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _shm(pattern: str) -> set[Path]:
    return set(Path("/dev/shm").glob(pattern))


def _left(pattern: str) -> str:
    """Processes of this checkout (its virtualenvs' paths in their command lines) matching
    `pattern`: a bench run from another checkout on the same machine is not this one's."""
    found = subprocess.run(["pgrep", "-af", pattern], check=False, capture_output=True, text=True)
    return "".join(line for line in found.stdout.splitlines(True) if str(ROOT) in line)


@pytest.mark.timeout(720)
def test_compare_measures_every_path_for_every_model() -> None:
    """Every model once, the real ones (their stubs import torch) included: swap-in, Triton
    unload+load and one-at-a-time for each; for the real ones also the restore after a
    kill of the model's process and the fresh load after the same kill."""
    out = _run(["bench.compare", "--reps", "1", "--real-reps", "1", "--big-mib", "16"], 700)
    lines = out.splitlines()
    for model in ("mlp", "tinylm", "big", "embed", "tinyllama"):
        line = next(x for x in lines if x.startswith(f"{model} ") and "modelswap" in x)
        assert "unload+load" in line and "one-at-a-time" in line
    for model in ("embed", "tinyllama"):
        line = next(x for x in lines if x.startswith(f"{model} ") and "restore" in x)
        assert "fresh load after kill" in line and "in a new stub: imports" in line
        assert "load" in line and "vs bind" in line
    assert not any(x.startswith(("mlp ", "tinylm ", "big ")) and "restore" in x for x in lines)
    assert "modelswap-bench-compare-" not in _left("modelswap-bench-compare-")
    assert "modelswap-bench-models-" not in _left("modelswap-bench-models-")


@pytest.mark.timeout(300)
def test_swap_splits_each_swap_in_and_fits_the_fixed_cost() -> None:
    before = _shm("modelswap-bench-*")  # a bench killed outright elsewhere is not this run's
    out = _run(["bench.swap", "--sizes-mib", "32,64", "--reps", "2"], 280)
    for mib in (32, 64):
        line = next(x for x in out.splitlines() if x.startswith(f"{mib:5d} MiB  swap-in"))
        assert "map round trip" in line and "restore round trip" in line
        assert "the client's copy" in line
    assert "fixed cost per swap-in" in out
    assert not _shm("modelswap-bench-*") - before


@pytest.mark.timeout(300)
def test_gateway_reports_each_figure() -> None:
    out = _run(
        ["bench.gateway", "--window-seconds", "0.5", "--windows", "1", "--open-seconds", "2",
         "--swap-reps", "2", "--profile-seconds", "1"],
        280,
    )  # fmt: skip
    for what in (
        "direct saturation",
        "p50 added",
        "agent's event loop: ",
        "100 concurrent",
        "gRPC open loop",
        "gRPC 100 concurrent: gateway/direct",
        "swap-in overhead",
    ):
        assert what in out
    assert "modelswap-bench-gw-" not in _left("modelswap-bench-gw-")


@pytest.mark.timeout(300)
def test_operator_scale_gets_a_small_cluster_ready() -> None:
    out = _run(
        ["bench.operator_scale", "--models", "30", "--nodes", "3", "--window-seconds", "2",
         "--timeout-seconds", "120"],
        280,
    )  # fmt: skip
    assert "ready 30/30" in out
    assert "bench.fake_nodes" not in _left("bench.fake_nodes --kubeconfig /tmp/kube-emulator")


@pytest.mark.timeout(300)
def test_twin_runs_a_short_scenario_and_replays_it() -> None:
    before = _shm("modelswap-bench-twin-*")
    out = _run(["bench.twin", "--runs", "1", "--time-scale", "300"], 280)
    line = next(x for x in out.splitlines() if x.startswith("run 0: ") and "requests" in x)
    sent, correct = line.split(" requests (")[0].split()[-1], line.split("(")[1].split()[0]
    assert int(sent) > 0 and sent == correct  # every answer checked and right
    assert "median swap-in: real" in out  # the replay ran and was compared
    assert "modelswap-bench-twin-" not in _left("modelswap-bench-twin-")
    assert not _shm("modelswap-bench-twin-*") - before
