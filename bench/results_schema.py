"""The result-file schema every modelswap benchmark writes (version 1).

    bench/results/<machine-class>/<bench>.json
    {
      "schema": "modelswap.bench/v1",
      "bench": "swap",
      "command": "make bench-swap",
      "machine_class": "amd-epyc-2cpu-nogpu",
      "machine": {"cpu_model": ..., "cpus": 2, "memory_bytes": ..., "gpu": "none"},
      "git_commit": "...", "git_uncommitted": [], "recorded_at": "2025-01-01T00:00:00Z",
      "backend": "sim", "scaled": false, "scaled_target_bytes_per_second": null,
      "notes": ["definitions of ceilings and baselines", ...],
      "results": [
        {"name": "swap_in", "params": {"model_bytes": ...}, "unit": "seconds",
         "samples": [...], "median": ..., "metrics": {"throughput_bytes_per_second": ...,
         "ratio_to_ceiling": ..., "ratio_to_sync_baseline": ...}}
      ]
    }

`git_uncommitted` lists the tracked files that differed from that commit when the bench
ran (results and docs/BENCHMARKS.md, which the benches write, left out): a figure from a
tree with uncommitted changes says so beside its commit.

`scaled` is true when copies were paced to an emulated link (the sim backend's pacing)
rather than measured at the hardware's own speed; `scaled_target_bytes_per_second` is then
that link's bandwidth, and rows whose figures the pacing shaped carry it as
`params.pace_bytes_per_second`. Renderers must say so beside every such figure.

The machine class names the hardware (CPU model, CPU count, GPU), never the host name, so
runs on equal machines land in the same folder.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

SCHEMA = "modelswap.bench/v1"
RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpu_model": cpu,
        "cpus": os.cpu_count() or 1,
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "gpu": "none",
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def machine_class(m: dict[str, Any]) -> str:
    cpu = re.sub(r"[^a-z0-9]+", "-", str(m["cpu_model"]).lower()).strip("-")
    gpu = re.sub(r"[^a-z0-9]+", "-", str(m["gpu"]).lower()).strip("-")
    return f"{cpu}-{m['cpus']}cpu-{'nogpu' if gpu == 'none' else gpu}"


def result(
    name: str, params: dict[str, Any], samples: list[float], unit: str = "seconds", **metrics: float
) -> dict[str, Any]:
    return {
        "name": name,
        "params": params,
        "unit": unit,
        "samples": samples,
        "median": statistics.median(samples),
        "metrics": metrics,
    }


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages: a shared machine's noise, recorded beside
    every result so a reader can tell a quiet run from a contended one."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def spread(samples: list[float]) -> dict[str, float]:
    """min, quartiles and max of `samples` (the spread a median hides)."""
    ordered = sorted(samples)
    q = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return {"min": ordered[0], "p25": q[0], "p75": q[2], "max": ordered[-1]}


_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b}


def target(
    row: dict[str, Any], metric: str, op: str, goal: float, what: str, *, why: str = ""
) -> dict[str, Any]:
    """Attach a target to `row`: its `metric` (or "median") against `goal`; the verdict is
    computed here, never written by hand. `why`: where a miss comes from, told in the
    run's own figures (kept, and rendered, only when the target is missed). Returns the
    row."""
    measured = row["median"] if metric == "median" else row["metrics"][metric]
    met = _OPS[op](measured, goal)
    entry = {
        "what": what,
        "metric": metric,
        "op": op,
        "goal": goal,
        "measured": measured,
        "verdict": "met" if met else "missed",
    }
    if why and not met:
        entry["why"] = why
    row.setdefault("targets", []).append(entry)
    return row


#: what the benches write themselves: never an uncommitted change to a figure's code
_WRITTEN_BY_BENCHES = ("bench/results/", "docs/BENCHMARKS.md", "docs/img/")


def git_state(cwd: Path | None = None) -> tuple[str, list[str]]:
    """(HEAD's commit, the tracked files changed since it, bench outputs left out); ("", [])
    outside a git checkout."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], capture_output=True, text=True, check=False, cwd=cwd
            )
        except OSError:
            return ""
        return done.stdout if done.returncode == 0 else ""

    commit = git("rev-parse", "HEAD").strip()
    changed = git("diff", "--name-only", "HEAD").split()
    return commit, sorted(p for p in changed if not p.startswith(_WRITTEN_BY_BENCHES))


def write(
    bench: str,
    command: str,
    results: list[dict[str, Any]],
    notes: list[str],
    *,
    backend: str,
    scaled: bool,
    scaled_target_bytes_per_second: float | None = None,
    load_average_start: list[float] | None = None,
    gpu: str | None = None,
    out: Path | None = None,
) -> Path:
    """Write one bench's results to `out` (default: bench/results/<machine class>/<bench>.json).

    `gpu` names the card the figures come from, for a bench that knows it. A GPU machine
    gets a copy of the tree whose .git may be another commit's: the caller then names the
    commit it sent in MODELSWAP_BENCH_COMMIT, and that is recorded."""
    if scaled != (scaled_target_bytes_per_second is not None):
        raise ValueError("a scaled result names its target bandwidth, an unscaled one none")
    m = machine()
    if gpu is not None:
        m["gpu"] = gpu
    commit, uncommitted = git_state(RESULTS.parents[1])
    sent = os.environ.get("MODELSWAP_BENCH_COMMIT")
    if sent:
        commit, uncommitted = sent, []
    doc = {
        "schema": SCHEMA,
        "bench": bench,
        "command": command,
        "machine_class": machine_class(m),
        "machine": m,
        "git_commit": commit,
        "git_uncommitted": uncommitted,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "backend": backend,
        "scaled": scaled,
        "scaled_target_bytes_per_second": scaled_target_bytes_per_second,
        "notes": notes,
        "results": results,
    }
    if load_average_start is not None:
        # 1/5/15-minute load averages when the bench started and when it ended
        doc["load_average"] = {"start": load_average_start, "end": load_average()}
    path = out if out is not None else RESULTS / str(doc["machine_class"]) / f"{bench}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
