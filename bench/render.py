"""Render docs/BENCHMARKS.md from every committed bench/results/<machine-class>/<bench>.json.

Scaled (paced) results are marked as such in their heading and beside every figure the
pacing shaped. Benches in `BENCHES` with no committed result file are listed as such, and
the page says outright when no result comes from a GPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.results_schema import RESULTS, SCHEMA

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "BENCHMARKS.md"

#: every benchmark this repository has: result name → (command, what it measures, needs).
#: A bench missing here is still rendered if it has results; one listed here without
#: results is reported as not run.
BENCHES: dict[str, tuple[str, str, str]] = {
    "swap": (
        "make bench-swap (python -m bench.swap)",
        "sim engine swap-in/out vs this machine's copy ceiling and a one-at-a-time baseline",
        "any Linux machine",
    ),
    "swap-paced": (
        "make bench-swap (python -m bench.swap --pace-gbps 2)",
        "the same with copies paced to an emulated slow link (scaled)",
        "any Linux machine",
    ),
    "gpu-swap": (
        "python bench/gpu_swap.py",
        "cuda-vmm swap-in/out on a real GPU vs the pinned cudaMemcpy ceiling (goal >= 0.9) "
        "and a one-allocation-at-a-time baseline",
        "an NVIDIA GPU with cuda-bindings and nvidia-ml-py",
    ),
    "planner": (
        "make bench-planner (python -m bench.planner)",
        "the operator's placement planner: 2,000 ModelDeployments over 100 SwapNodes x 8 GPUs, "
        "cold, warm re-plan and after 5 nodes are lost",
        "any machine (pure Python, no GPU)",
    ),
    "sim": (
        "make bench-sim (python -m bench.sim)",
        "modelswap simulate on bench/scenarios/ref-h100.yaml: each policy's fewest GPUs "
        "meeting p99 added latency <= 1 s, against issue 14's target",
        "any machine (pure Python, no GPU)",
    ),
    "sim-grid": (
        "make bench-grid (python -m bench.sim --grid)",
        "the simulator's sensitivity grid around ref-h100: zipf alpha x link x rate",
        "any machine (pure Python, no GPU)",
    ),
}

_COLUMNS = {"throughput_bytes_per_second", "ratio_to_ceiling", "ratio_to_sync_baseline"}


def _fmt(value: float, unit: str) -> str:
    return f"{value * 1e3:.1f} ms" if unit == "seconds" else f"{value:g} {unit}"


def _gbps(bytes_per_second: float) -> str:
    return f"{bytes_per_second / 1e9:.2f} GB/s"


def render_doc(doc: dict[str, Any]) -> list[str]:
    m = doc["machine"]
    scaled = bool(doc.get("scaled"))
    target = doc.get("scaled_target_bytes_per_second")
    title = f"## `{doc['bench']}` on {doc['machine_class']}"
    if scaled:
        title += f" — SCALED (paced to {_gbps(target) if target else 'an emulated link'})"
    lines = [title, ""]
    if scaled:
        lines += [
            f"> **Scaled, not measured link speed.** Copies were paced to an emulated "
            f"{_gbps(target) if target else '(unknown)'} link on a CPU; figures marked "
            "*(scaled)* describe that emulation and the engine's overhead on top of it, not "
            "any real GPU link.",
            "",
        ]
    backend = (
        "Pure Python, no engine and no GPU"
        if doc["backend"] == "none"
        else f"Backend: {doc['backend']}; scaled (paced): {scaled}"
        + (f", target {_gbps(target)}" if scaled and target else "")
    )
    lines += [
        f"- Command: `{doc['command']}`",
        f"- Machine: {m['cpu_model']}, {m['cpus']} CPUs, {m['memory_bytes'] / 2**30:.0f} GiB "
        f"memory, GPU: {m['gpu']}; kernel {m.get('kernel', '?')}, Python {m.get('python', '?')}",
        f"- {backend}; commit `{doc['git_commit'][:12]}`{_uncommitted(doc)}; "
        f"recorded {doc['recorded_at']}",
        "",
    ]
    lines += _load_lines(doc)
    lines += [f"- {n}" for n in doc["notes"]]
    table = _TABLES.get(doc["bench"], _swap_table)
    return [*lines, "", *table(doc), "", *_target_lines(doc)]


def _swap_table(doc: dict[str, Any]) -> list[str]:
    lines = [
        "| measurement | model bytes | median | throughput | x ceiling | x sync | other |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in doc["results"]:
        mt = r["metrics"]
        paced = "pace_bytes_per_second" in r["params"]
        mark = " *(scaled)*" if paced else ""
        size = r["params"].get("model_bytes", 0)
        tput = mt.get("throughput_bytes_per_second")
        row = f"| {r['name']}{mark} | {size / 2**20:.0f} MiB | {_fmt(r['median'], r['unit'])} | "
        row += f"{_gbps(tput)}{mark} | " if tput else "| "
        if "ratio_to_ceiling" in mt:
            row += f"{mt['ratio_to_ceiling']:.2f}{' of link' if paced else ''} | "
        else:
            row += "| "
        row += f"{mt['ratio_to_sync_baseline']:.2f} |" if "ratio_to_sync_baseline" in mt else "|"
        other = [
            f"{k} {_fmt(v, 'seconds') if k.endswith('_seconds') else _other(k, v)}"
            for k, v in mt.items()
            if k not in _COLUMNS
        ]
        lines.append(f"{row} {'; '.join(other)} |")
    return lines


_PLANNER_COUNTS = ("placed", "unplaced", "kept", "moved", "gpus_used")


def _other(key: str, value: float) -> str:
    return _gbps(value) if key.endswith("_bytes_per_second") else f"{value:.2f}"


def _planner_table(doc: dict[str, Any]) -> list[str]:
    """One row per planner scenario: median and range of one `plan` call, and its outcome."""
    lines = [
        "| scenario | models | nodes (GPUs) | median | min to max | placed | unplaced | kept "
        "| moved | GPUs used |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["results"]:
        p, mt = r["params"], r["metrics"]
        nodes = f"{p.get('nodes', '?')} ({p.get('gpus', '?')})"
        if p.get("nodes_lost"):
            nodes += f", {p['nodes_lost']} lost"
        spread = f"{_fmt(min(r['samples']), r['unit'])} to {_fmt(max(r['samples']), r['unit'])}"
        counts = " | ".join(f"{mt[k]:g}" if k in mt else "" for k in _PLANNER_COUNTS)
        lines.append(
            f"| {r['name']} | {p.get('models', '?')} | {nodes} | "
            f"{_fmt(r['median'], r['unit'])} | {spread} | {counts} |"
        )
    return lines


def _seconds(value: float | None) -> str:
    if value is None:
        return "never served"
    return f"{value:.2f} s" if value >= 1 else f"{value * 1e3:.0f} ms"


def _sim_table(doc: dict[str, Any]) -> list[str]:
    """Each policy's fewest GPUs meeting the target, that run's figures, the verdict."""
    target = doc.get("target", {})
    lines = [
        "| policy | fewest GPUs | p50 added | p99 added | p99 wait | waited | swaps/h | "
        "GPU-hours | p99 added at each GPU count tried |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in doc["results"]:
        mt, runs = r["metrics"], r["params"].get("runs", [])
        curve = ", ".join(f"{c['gpus']}: {_seconds(c['p99_added_seconds'])}" for c in runs)
        if r["median"] is None:
            lines.append(f"| {r['name']} | none | | | | | | | {curve} |")
            continue
        lines.append(
            f"| {r['name']} | {r['median']:g} | {_seconds(mt['p50_added_seconds'])} | "
            f"{_seconds(mt['p99_added_seconds'])} | {_seconds(mt['p99_wait_seconds'])} | "
            f"{mt['waited_share']:.1%} | {mt['swaps_per_hour']:.0f} | {mt['gpu_hours']:.0f} | "
            f"{curve} |"
        )
    v = doc.get("verdict")
    if v:
        fewest = v["modelswap_fewest_gpus"]
        baselines = ", ".join(
            f"{name} {'none' if n is None else n}" for name, n in v["baselines_fewest_gpus"].items()
        )
        lines += [
            "",
            f"**Target** (issue 14): p99 added latency <= {target.get('p99_added_seconds', 1):g} s "
            f"with at most {target.get('max_gpus', 8)} GPUs and fewer GPUs than every baseline. "
            f"**Measured**: modelswap ({v['modelswap_policy']}) needs "
            f"{'no count up to the maximum' if fewest is None else fewest} GPUs; baselines: "
            f"{baselines}. **Verdict: {'met' if v['met'] else 'MISSED'}** "
            f"(at most {target.get('max_gpus', 8)} GPUs: "
            f"{'yes' if v['at_most_8_gpus'] else 'no'}; fewer than every baseline: "
            f"{'yes' if v['fewer_than_every_baseline'] else 'no'}). Why: docs/SIMULATE.md.",
        ]
    if doc.get("plot"):
        lines += ["", f"![p99 added latency against GPUs per policy]({doc['plot']})"]
    return lines


def _sim_grid_table(doc: dict[str, Any]) -> list[str]:
    """One row per grid cell: every policy's fewest GPUs, and the verdict there."""
    policies: list[str] = []
    for r in doc["results"]:
        policies += [p for p in r["metrics"] if p not in policies]
    lines = [
        "| zipf alpha | link | rate | " + " | ".join(policies) + " | target met |",
        "|---:|---:|---:|" + "---:|" * len(policies) + "---|",
    ]
    for r in doc["results"]:
        p = r["params"]
        counts = " | ".join(
            "none" if r["metrics"].get(name) is None else f"{r['metrics'][name]:g}"
            for name in policies
        )
        met = r.get("verdict", {}).get("met")
        lines.append(
            f"| {p['zipf_alpha']:g} | {p['host_to_device_gbps']:g} GB/s | "
            f"{p['mean_rate_per_second']:g}/s | {counts} | {'yes' if met else 'no'} |"
        )
    return lines


#: benches whose results need their own table; the rest use the swap table
_TABLES = {"planner": _planner_table, "sim": _sim_table, "sim-grid": _sim_grid_table}


def _uncommitted(doc: dict[str, Any]) -> str:
    """Beside the commit: the files the run's tree had changed since it, if any."""
    changed = doc.get("git_uncommitted") or []
    if not changed:
        return ""
    return " **plus uncommitted changes to " + ", ".join(f"`{p}`" for p in changed) + "**"


def _load_lines(doc: dict[str, Any]) -> list[str]:
    """The machine's load average when the bench started and ended, and a warning when it
    was high at the start. The end's figure counts the bench's own work, so it warns of
    nothing; the start's counts the last minute's, the step of `make bench` before this one
    included, so a high one says other work may have shared the CPUs, not that it did."""
    load = doc.get("load_average")
    if not load:
        return []
    cpus = doc["machine"].get("cpus") or 1
    start, end = load.get("start") or [0.0], load.get("end") or [0.0]
    line = (
        f"- Load average (1/5/15 min) at start {', '.join(f'{x:.2f}' for x in start)}; "
        f"at end {', '.join(f'{x:.2f}' for x in end)} ({cpus} CPUs)"
    )
    if start[0] > 0.5 * cpus:
        line += (
            f". **The 1-minute load was above {0.5 * cpus:g} at the start**: it decays over "
            "minutes and counts the previous step of `make bench` as well as any other work, "
            "so other work may have shared the CPUs and these figures may be noisier."
        )
    return [line]


def _target_lines(doc: dict[str, Any]) -> list[str]:
    """Every target a result carries, with the measured value and the computed verdict."""
    targets = [t for r in doc["results"] for t in r.get("targets", ())]
    if not targets:
        return []
    lines = ["| target | measured | verdict |", "|---|---:|---|"]
    for t in targets:
        lines.append(
            f"| {t['what']} ({t['metric']} {t['op']} {_fmt_value(t['goal'], t['metric'])}) | "
            f"{_fmt_value(t['measured'], t['metric'])} | "
            f"{'met' if t['verdict'] == 'met' else '**MISSED**'} |"
        )
    lines.append("")
    for t in targets:
        if t["verdict"] != "met" and t.get("why"):
            lines.append(f"- Why *{t['what']}* was missed: {t['why']}")
    if lines[-1]:
        lines.append("")
    return lines


def _fmt_value(value: float, metric: str) -> str:
    if metric.endswith("_seconds") or metric == "median":
        return f"{value * 1e3:.2f} ms" if abs(value) < 1 else f"{value:.1f} s"
    return f"{value:.2f}"


def render_missing(docs: list[dict[str, Any]]) -> list[str]:
    """Benches with no committed result, and whether any result comes from a GPU."""
    have = {d["bench"] for d in docs}
    missing = [name for name in BENCHES if name not in have]
    gpu_docs = [d for d in docs if str(d["machine"].get("gpu", "none")) != "none"]
    lines = ["## Not measured yet", ""]
    if not gpu_docs:
        lines += [
            "**No GPU results exist yet.** Every swap figure on this page comes from the sim "
            "backend on a CPU (memfd chunks in host memory); none is a GPU or PCIe/C2C "
            "measurement. The GPU bench (`bench/gpu_swap.py`) has not run on a GPU machine.",
            "",
        ]
    if missing:
        lines += ["Benches with no committed result file:", ""]
        lines += [
            f"- `{name}` — {BENCHES[name][1]}; command `{BENCHES[name][0]}`; needs "
            f"{BENCHES[name][2]}."
            for name in missing
        ]
    else:
        lines.append("Every bench has at least one committed result file.")
    return [*lines, ""]


# -- compare, gateway, operator (bench/compare.py, bench/gateway.py, bench/operator_scale.py) --

BENCHES.update(
    {
        "compare": (
            "make bench-compare (python -m bench.compare)",
            "swap-in to the first correct answer vs Triton unload+load and a "
            "one-allocation-at-a-time restore (the real example models, the toys and a "
            "generated 1 GiB model); the real models' restore after a kill vs a fresh load",
            "any Linux machine with `make setup` (Triton)",
        ),
        "gateway": (
            "make bench-gateway (python -m bench.gateway)",
            "latency the gateway adds at half the direct path's saturation, throughput at 100 "
            "concurrent, control overhead of a request-triggered swap-in",
            "any Linux machine with `make setup` (Triton)",
        ),
        "operator": (
            "make bench-operator (python -m bench.operator_scale)",
            "the real operator over 2,000 ModelDeployments and 100 fake agents on the API "
            "emulator: time to all Ready, planner time, steady-state writes, CPU and memory",
            "any Linux machine with `make setup`",
        ),
    }
)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if abs(seconds) < 10 else f"{seconds:.1f} s"


def _compare_table(doc: dict[str, Any]) -> list[str]:
    """One row per model: the three paths to the first correct answer and the speedups;
    then, for the models that have them, the restore after a kill vs a fresh load."""
    by_model: dict[str, dict[str, dict[str, Any]]] = {}
    for r in doc["results"]:
        by_model.setdefault(r["params"]["model"], {})[r["name"]] = r
    lines = [
        "| model | bytes | modelswap swap-in to answer | (swap-in call) | Triton unload+load "
        "to answer | one-at-a-time to answer (composite) | x faster than unload+load "
        "| x faster than one-at-a-time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model, rows in by_model.items():
        swap = rows["modelswap_swap_in_to_answer"]
        mt = swap["metrics"]
        cold = rows["triton_unload_load_to_answer"]
        sync = rows["one_at_a_time_to_answer"]
        lines.append(
            f"| {model} | {swap['params']['model_bytes'] / 2**20:.0f} MiB | "
            f"{_ms(swap['median'])} | {_ms(mt['swap_in_call_seconds'])} | "
            f"{_ms(cold['median'])} | {_ms(sync['median'])} | "
            f"{mt['speedup_vs_unload_load']:.1f} | {mt['speedup_vs_one_at_a_time']:.2f} |"
        )
    restored = {m: rows for m, rows in by_model.items() if "restore_after_kill_to_answer" in rows}
    if restored:
        lines += [
            "",
            "After a kill -9 of the model's process: the node's restore (the new process binds "
            "the host copy, no weight file read) vs a fresh load after the same kill (the host "
            "copy made stale: the weight files read again), each to the first correct answer:",
            "",
            "| model | bytes | restore to answer | fresh load to answer | x faster than fresh "
            "load | in a new stub: torch + transformers imports | first build (modeling code "
            "import) | from_pretrained: load from files | from_pretrained: bind host copy |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for model, rows in restored.items():
            restore = rows["restore_after_kill_to_answer"]
            fresh = rows["fresh_load_after_kill_to_answer"]
            m = restore["metrics"]
            # seconds, not ms: a new process's start takes several
            lines.append(
                f"| {model} | {restore['params']['model_bytes'] / 2**20:.0f} MiB | "
                f"{restore['median']:.2f} s | {fresh['median']:.2f} s | "
                f"{m['speedup_vs_fresh_load']:.2f} | {m['stub_imports_seconds']:.2f} s | "
                f"{m['stub_first_build_seconds']:.2f} s | "
                f"{m['stub_load_from_files_seconds']:.3f} s | "
                f"{m['stub_bind_host_copy_seconds']:.3f} s |"
            )
    return lines


def _gateway_table(doc: dict[str, Any]) -> list[str]:
    lines = ["| measurement | median | figures |", "|---|---:|---|"]
    for r in doc["results"]:
        unit = r["unit"]
        median = _ms(r["median"]) if unit == "seconds" else f"{r['median']:.1f} {unit}"
        figures = "; ".join(
            f"{k} {_ms(v) if k.endswith('_seconds') else f'{v:.2f}'}"
            for k, v in r["metrics"].items()
            if k not in ("min", "p25", "p75", "max")
        )
        lines.append(f"| {r['name']} | {median} | {figures} |")
    return lines


def _operator_table(doc: dict[str, Any]) -> list[str]:
    lines = ["| measurement | value | figures |", "|---|---:|---|"]
    for r in doc["results"]:
        unit = r["unit"]
        value = _ms(r["median"]) if unit == "seconds" else f"{r['median']:.2f} {unit}"
        figures = []
        for k, v in r["metrics"].items():
            if k.endswith("_bytes"):
                figures.append(f"{k} {v / 2**20:.0f} MiB")
            elif k.endswith("_seconds") or k.endswith("seconds_total"):
                figures.append(f"{k} {_ms(v)}")
            else:
                figures.append(f"{k} {v:g}" if float(v).is_integer() else f"{k} {v:.3f}")
        lines.append(f"| {r['name']} | {value} | {'; '.join(figures)} |")
    return lines


BENCHES["operator-profile"] = (
    "make bench-operator-profile (python -m bench.operator_scale --profile)",
    "the same run with the operator and the emulator under cProfile: where the time goes",
    "any Linux machine with `make setup`",
)
_TABLES.update(
    {
        "compare": _compare_table,
        "gateway": _gateway_table,
        "operator": _operator_table,
        "operator-profile": _operator_table,
    }
)


# -- twin (bench/twin.py) -------------------------------------------------------------------

BENCHES["twin"] = (
    "make bench-twin (python -m bench.twin)",
    "the twin check: a seeded, time-scaled scenario run for real in local mode (paced sim "
    "GPU, scaled) and replayed through the simulator: swap counts and median swap-in latency",
    "any Linux machine with `make setup` (Triton)",
)


def _twin_table(doc: dict[str, Any]) -> list[str]:
    """One row per run: real and simulated swap counts and median swap-in durations; then
    the pooled figures."""
    by_name = {r["name"]: r for r in doc["results"]}
    counts, latency = by_name["swap_ins_per_run"], by_name["swap_in_seconds"]

    def ms(value: float | None) -> str:
        return "-" if value is None else _ms(value)

    lines = [
        "| run | requests (correct) | swap-ins real / sim | swap-outs real / sim | median "
        "swap-in real / sim | counts match |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for i, run in enumerate(counts.get("runs", [])):
        lines.append(
            f"| {i} | {run['requests']} ({run['correct']}) | {run['real_swap_ins']} / "
            f"{run['sim_swap_ins']} | {run['real_swap_outs']} / {run['sim_swap_outs']} | "
            f"{ms(run['real_median_swap_in_seconds'])} / "
            f"{ms(run['sim_median_swap_in_seconds'])} | "
            f"{'yes' if run['swap_counts_match'] else '**no**'} |"
        )
    mt = latency["metrics"]
    lines += [
        "",
        f"Median swap-in over every run (samples pooled, {mt['samples_real']:.0f} real): "
        f"real {_ms(latency['median'])} *(scaled)*, simulated {_ms(mt['sim_median_seconds'])} "
        f"(difference {_ms(mt['difference_seconds'])}, tolerance "
        f"{_ms(mt['tolerance_seconds'])}); the link's share {_ms(mt['link_seconds'])}, "
        f"the calibrated fixed cost {_ms(mt['fixed_cost_seconds'])}; real spread "
        f"{_ms(mt['min'])} .. {_ms(mt['max'])}.",
    ]
    for name, what in (("calibration_swap_in_seconds", "swap-ins"),
                       ("calibration_swap_out_seconds", "swap-outs")):  # fmt: skip
        row = by_name.get(name)
        if row is not None:
            m = row["metrics"]
            lines.append(
                f"Calibration {what} by hand before the runs ({len(row['samples'])}, nothing "
                f"to evict): median {_ms(row['median'])}, {_ms(m['min'])} .. {_ms(m['max'])}."
            )
    return lines


_TABLES["twin"] = _twin_table


# -- kv (bench/kv.py) -------------------------------------------------------------------------

BENCHES["kv"] = (
    "make bench-kv (python -m bench.kv)",
    "a Llama's KV cache in the tiered pool: HBM KV bytes against sequence length with and "
    "without offloadAfterTokens; continuing a 2,000-token conversation after a swap with "
    "kv: preserve vs discard (recompute) vs no swap",
    "any Linux machine with torch and transformers 5.x (sim); --backend cuda-vmm on an NVIDIA GPU",
)


def _mib(n: float) -> str:
    return f"{n / 2**20:.3f} MiB"


def _kv_table(doc: dict[str, Any]) -> list[str]:
    """HBM and host KV bytes per sequence length, without and with offloadAfterTokens; the
    continuation after a swap per scenario; a reading computed from those figures."""
    sizes = [r for r in doc["results"] if r["name"] == "kv_bytes_at_length"]
    conts = {
        r["params"]["scenario"]: r for r in doc["results"] if r["name"] == "continue_after_swap"
    }
    off = {
        r["params"]["sequence_tokens"]: r
        for r in sizes
        if r["params"]["offload_after_tokens"] is None
    }
    on = {
        r["params"]["sequence_tokens"]: r
        for r in sizes
        if r["params"]["offload_after_tokens"] is not None
    }
    offload = next(iter(on.values()))["params"]["offload_after_tokens"] if on else None
    lines = [
        "HBM KV bytes against sequence length (the pool's accounting; the agent's view from "
        "the heartbeats beside it):",
        "",
        f"| sequence tokens | HBM, no host tier | HBM, offloadAfterTokens {offload} | host, "
        f"offloadAfterTokens {offload} | agent's view agrees |",
        "|---:|---:|---:|---:|---|",
    ]
    for length in sorted(set(off) | set(on)):
        cells = []
        agree = True
        for row, key in ((off.get(length), "hbm_bytes"), (on.get(length), "hbm_bytes"),
                         (on.get(length), "host_bytes")):  # fmt: skip
            cells.append("" if row is None else _mib(row["metrics"][key]))
        for row in (off.get(length), on.get(length)):
            if row is not None:
                m = row["metrics"]
                agree &= (
                    m["agent_hbm_bytes"] == m["hbm_bytes"]
                    and m["agent_host_bytes"] == m["host_bytes"]
                )
        lines.append(f"| {length} | {' | '.join(cells)} | {'yes' if agree else '**no**'} |")
    lines += [
        "",
        "Continuing a conversation after a swap (medians; one row per scenario, all run side "
        "by side in every repetition):",
        "",
        "| scenario | median | min to max | x no swap | swap-in | turn | swap-out (not in the "
        "total) | "
        "prefix tokens reused | recomputed | tokens right |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in conts.items():
        m = r["metrics"]
        lines.append(
            f"| {name} | {_ms(r['median'])} | {_ms(m['min'])} to {_ms(m['max'])} | "
            f"{m['ratio_to_no_swap']:.2f} | {_ms(m['swap_in_seconds'])} | "
            f"{_ms(m['turn_seconds'])} | {_ms(m['swap_out_seconds'])} | "
            f"{m['reused_tokens']:g} | {m['recomputed_tokens']:g} | "
            f"{'yes' if m['tokens_right'] else '**no**'} |"
        )
    return [*lines, "", *_kv_reading(off, on, offload, conts)]


def _kv_reading(
    off: dict[int, dict[str, Any]],
    on: dict[int, dict[str, Any]],
    offload: int | None,
    conts: dict[str, dict[str, Any]],
) -> list[str]:
    """What the figures say, in sentences made from them (never typed by hand)."""
    lines = []
    if off and on:
        longest = max(set(off) & set(on))
        past = [n for n in on if offload is not None and n >= offload]
        hbm_on = {on[n]["metrics"]["hbm_bytes"] for n in past}
        flat = len(hbm_on) == 1
        m_on, m_off = on[longest]["metrics"], off[longest]["metrics"]
        lines.append(
            f"**Reading.** With offloadAfterTokens {offload}, the HBM tier's KV bytes "
            + (
                f"stay at {_mib(hbm_on.pop())} from {min(past)} tokens on"
                if flat and past
                else "**do not stay flat** past offloadAfterTokens"
            )
            + f"; at {longest} tokens HBM holds {_mib(m_on['hbm_bytes'])} against "
            f"{_mib(m_off['hbm_bytes'])} without a host tier "
            f"({m_on['hbm_bytes'] / m_off['hbm_bytes']:.0%}), the other "
            f"{_mib(m_on['host_bytes'])} in the host tier."
        )
    if {"no swap", "preserve", "discard"} <= set(conts):
        base, keep, drop = conts["no swap"], conts["preserve"], conts["discard"]
        tokens = base["params"]["conversation_tokens"]
        lines.append(
            f"Continuing a {tokens:,}-token conversation took {_ms(base['median'])} with no "
            f"swap, {_ms(keep['median'])} after a preserve swap "
            f"({keep['metrics']['ratio_to_no_swap']:.2f}x, its prefix reused: "
            f"{keep['metrics']['recomputed_tokens']:g} tokens recomputed) and "
            f"{_ms(drop['median'])} after a discard swap "
            f"({drop['metrics']['ratio_to_no_swap']:.2f}x, "
            f"{drop['metrics']['recomputed_tokens']:g} prefix tokens recomputed); "
            "ratios are per repetition, the three run side by side."
        )
    return [" ".join(lines), ""]


_TABLES["kv"] = _kv_table


def load_docs() -> list[dict[str, Any]]:
    docs = []
    for path in RESULTS.glob("*/*.json"):
        doc = json.loads(path.read_text())
        if doc.get("schema") != SCHEMA:
            print(f"skipping {path}: schema {doc.get('schema')!r}", file=sys.stderr)
            continue
        docs.append(doc)
    order = list(BENCHES)
    docs.sort(
        key=lambda d: (
            d["machine_class"],
            order.index(d["bench"]) if d["bench"] in order else len(order),
            d["bench"],
        )
    )
    return docs


def render(docs: list[dict[str, Any]]) -> str:
    out = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench.render` from every committed "
        "`bench/results/<machine-class>/<bench>.json` (schema `" + SCHEMA + "`, see "
        "`bench/results_schema.py`). Medians; do not edit by hand. Results marked SCALED "
        "were paced to an emulated link and are not link measurements.",
        "",
    ]
    out += render_missing(docs)
    for doc in docs:
        out += render_doc(doc)
    return "\n".join(out)


def main() -> int:
    OUT.write_text(render(load_docs()))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
