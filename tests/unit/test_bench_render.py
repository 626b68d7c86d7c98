"""docs/BENCHMARKS.md says which figures are scaled and which benches have not run."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import render, results_schema, twin
from bench.twin_record import NodeShape, Request, RunRecord, SwapSeen, replay, verdict

pytestmark = pytest.mark.timeout(30)

MIB = 1 << 20


def doc(bench: str, *, gpu: str = "none", target: float | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"model_bytes": 64 * MIB}
    if target is not None:
        params["pace_bytes_per_second"] = target
    return {
        "schema": results_schema.SCHEMA,
        "bench": bench,
        "command": "make bench-swap",
        "machine_class": "cpu-2cpu-nogpu" if gpu == "none" else f"cpu-2cpu-{gpu}",
        "machine": {"cpu_model": "CPU", "cpus": 2, "memory_bytes": 2**34, "gpu": gpu},
        "git_commit": "0" * 40,
        "recorded_at": "2026-01-01T00:00:00Z",
        "backend": "sim",
        "scaled": target is not None,
        "scaled_target_bytes_per_second": target,
        "notes": ["a note"],
        "results": [
            results_schema.result(
                "swap_in",
                params,
                [0.04],
                throughput_bytes_per_second=1.9e9,
                ratio_to_ceiling=0.9,
                ratio_to_sync_baseline=1.1,
            ),
            results_schema.result(
                "swap_out",
                {"model_bytes": 64 * MIB},
                [0.03],
                throughput_bytes_per_second=2.2e9,
            ),
        ],
    }


def test_scaled_results_are_marked_beside_every_paced_figure() -> None:
    page = render.render([doc("swap"), doc("swap-paced", target=2e9)])
    paced = page[page.index("## `swap-paced`") :]
    heading = paced.splitlines()[0]
    assert "SCALED" in heading and "2.00 GB/s" in heading
    assert "Scaled, not measured link speed" in paced
    swap_in = next(line for line in paced.splitlines() if line.startswith("| swap_in"))
    assert "1.90 GB/s *(scaled)*" in swap_in and "0.90 of link" in swap_in
    swap_out = next(line for line in paced.splitlines() if line.startswith("| swap_out"))
    assert "scaled" not in swap_out  # nothing copied, nothing paced
    plain = page[page.index("## `swap` on") : page.index("## `swap-paced`")]
    assert "scaled" not in plain.replace("scaled (paced): False", "")


def test_benches_without_results_and_the_absence_of_gpu_results_are_stated() -> None:
    page = render.render([doc("swap")])
    missing = page[page.index("## Not measured yet") : page.index("## `swap` on")]
    assert "No GPU results exist yet" in missing
    assert "`gpu-swap`" in missing and "`swap-paced`" in missing and "`planner`" in missing
    assert "make bench-planner" in missing
    assert "- `swap` " not in missing
    simulated = [
        {**doc("swap"), "bench": name, "results": []} for name in ("sim", "sim-grid", "kv")
    ]
    simulated += [compare_doc(), gateway_doc(), operator_doc(), twin_doc()]
    simulated.append({**operator_doc(), "bench": "operator-profile"})
    with_gpu = render.render(
        [
            doc("swap"),
            doc("swap-paced", target=2e9),
            doc("gpu-swap", gpu="h100"),
            planner_doc(),
            *simulated,
        ]
    )
    assert "No GPU results exist yet" not in with_gpu
    assert "Every bench has at least one committed result file." in with_gpu


def test_a_scaled_result_must_name_its_target() -> None:
    with pytest.raises(ValueError, match="target"):
        results_schema.write("x", "cmd", [], [], backend="sim", scaled=True)


def planner_doc() -> dict[str, Any]:
    params = {"models": 2000, "nodes": 100, "gpus": 800, "reps": 3}
    rows = []
    for name, extra, samples in (
        ("cold", {}, [0.09, 0.08, 0.11]),
        ("node_loss", {"nodes_lost": 5}, [0.12, 0.13, 0.125]),
    ):
        row = results_schema.result(name, {**params, **extra}, samples)
        row["metrics"] = {
            "placed": 1998,
            "unplaced": 2,
            "kept": 950,
            "moved": 1048,
            "gpus_used": 99,
        }
        rows.append(row)
    return {
        **doc("planner"),
        "command": "make bench-planner (python -m bench.planner)",
        "backend": "none",
        "notes": ["synthetic cluster"],
        "results": rows,
    }


def test_planner_results_state_command_machine_and_outcome() -> None:
    page = render.render([doc("swap"), planner_doc()])
    section = page[page.index("## `planner` on cpu-2cpu-nogpu") :]
    assert "- Command: `make bench-planner (python -m bench.planner)`" in section
    assert "- Machine: CPU, 2 CPUs, 16 GiB memory, GPU: none" in section
    assert "Pure Python, no engine and no GPU" in section and "Backend: none" not in section
    node_loss = next(line for line in section.splitlines() if line.startswith("| node_loss"))
    assert "| 100 (800), 5 lost |" in node_loss
    assert "| 125.0 ms | 120.0 ms to 130.0 ms |" in node_loss
    assert "| 1998 | 2 | 950 | 1048 | 99 |" in node_loss
    assert "throughput" not in section  # not the swap table


# -- compare, gateway, operator ------------------------------------------------------------


def compare_doc() -> dict[str, Any]:
    params = {"model": "big", "model_bytes": 1024 * MIB, "reps": 3}
    swap = results_schema.result(
        "modelswap_swap_in_to_answer",
        params,
        [0.20, 0.21, 0.22],
        swap_in_call_seconds=0.15,
        speedup_vs_unload_load=4.0,
        speedup_vs_one_at_a_time=1.5,
    )
    results_schema.target(swap, "speedup_vs_unload_load", ">=", 5.0, "big: >= 5x unload+load")
    return {
        **doc("compare"),
        "command": "make bench-compare (python -m bench.compare)",
        "load_average": {"start": [3.5, 3.0, 2.0], "end": [0.4, 1.0, 1.5]},
        "results": [
            swap,
            results_schema.result("triton_unload_load_to_answer", params, [0.84]),
            results_schema.result("one_at_a_time_to_answer", params, [0.315]),
            results_schema.result("resident_answer", params, [0.005]),
        ],
    }


def compare_doc_with_a_real_model() -> dict[str, Any]:
    """compare_doc plus a real model's rows: its swap-in paths and its restore after a kill
    vs a fresh load."""
    base = compare_doc()
    params = {"model": "embed", "model_bytes": 87 * MIB, "reps": 3}
    swap = results_schema.result(
        "modelswap_swap_in_to_answer",
        params,
        [0.3],
        swap_in_call_seconds=0.05,
        speedup_vs_unload_load=40.0,
        speedup_vs_one_at_a_time=0.9,
    )
    restore = results_schema.result(
        "restore_after_kill_to_answer",
        params,
        [14.0, 15.0, 16.0],
        speedup_vs_fresh_load=1.04,
        stub_imports_seconds=9.5,
        stub_first_build_seconds=4.25,
        stub_load_from_files_seconds=0.5,
        stub_bind_host_copy_seconds=0.0625,
    )
    return {
        **base,
        "results": [
            *base["results"],
            swap,
            results_schema.result("triton_unload_load_to_answer", params, [12.0]),
            results_schema.result("one_at_a_time_to_answer", params, [0.27]),
            results_schema.result("resident_answer", params, [0.25]),
            restore,
            results_schema.result("fresh_load_after_kill_to_answer", params, [15.6]),
            results_schema.result("stub_imports", params, [9.5]),
            results_schema.result("stub_first_build", params, [4.25]),
            results_schema.result("stub_load_from_files", params, [0.5]),
            results_schema.result("stub_bind_host_copy", params, [0.0625]),
        ],
    }


def test_compare_gives_a_real_model_s_restore_after_a_kill_beside_a_fresh_load() -> None:
    page = render.render([doc("swap"), compare_doc_with_a_real_model()])
    section = page[page.index("## `compare` on") :]
    lines = section.splitlines()
    swap = next(line for line in lines if line.startswith("| embed | 87 MiB | 300.0 ms"))
    assert "| 12.0 s | 270.0 ms | 40.0 | 0.90 |" in swap
    restore = next(line for line in lines if line.startswith("| embed | 87 MiB | 15.00 s"))
    assert restore == (
        "| embed | 87 MiB | 15.00 s | 15.60 s | 1.04 | 9.50 s | 4.25 s | 0.500 s | 0.062 s |"
    )
    # the toy model has no restore rows: it is in the first table only
    assert sum(1 for line in lines if line.startswith("| big ")) == 1


def test_compare_without_restore_rows_renders_no_restore_table() -> None:
    page = render.render([doc("swap"), compare_doc()])
    assert "fresh load to answer" not in page


def gateway_doc() -> dict[str, Any]:
    added = results_schema.result(
        "gateway_added_latency", {}, [0.0004], p50_added_seconds=0.0004, p99_added_seconds=0.007
    )
    results_schema.target(added, "p50_added_seconds", "<=", 0.001, "gateway added p50 <= 1 ms")
    results_schema.target(
        added, "p99_added_seconds", "<=", 0.005, "gateway added p99 <= 5 ms",
        why="the direct path's own p99 is 20 ms at this load",
    )  # fmt: skip
    return {
        **doc("gateway"),
        "command": "make bench-gateway (python -m bench.gateway)",
        "results": [
            results_schema.result("direct_saturation", {}, [400.0], unit="requests/s"),
            added,
        ],
    }


def operator_doc() -> dict[str, Any]:
    ready = results_schema.result(
        "all_placed_and_ready", {"models": 2000}, [95.0], ready=2000.0, create_seconds=12.5
    )
    results_schema.target(ready, "median", "<=", 120.0, "2,000 models placed and Ready <= 120 s")
    steady = results_schema.result(
        "steady_state",
        {"models": 2000},
        [0.5],
        unit="writes/s",
        operator_rss_bytes=200.0 * MIB,
        operator_cpu_fraction_idle=0.125,
    )
    return {
        **doc("operator"),
        "command": "make bench-operator (python -m bench.operator_scale)",
        "backend": "none",
        "results": [ready, steady],
    }


def test_compare_rows_name_every_path_the_speedups_and_a_missed_target() -> None:
    page = render.render([doc("swap"), compare_doc()])
    section = page[page.index("## `compare` on") :]
    assert "- Command: `make bench-compare (python -m bench.compare)`" in section
    row = next(line for line in section.splitlines() if line.startswith("| big "))
    assert "| 1024 MiB | 210.0 ms | 150.0 ms | 840.0 ms | 315.0 ms | 4.0 | 1.50 |" in row
    verdict = next(line for line in section.splitlines() if line.startswith("| big: >= 5x"))
    assert "| 4.00 | **MISSED** |" in verdict
    # a high load at the start is said so beside the figures
    assert "at start 3.50, 3.00, 2.00; at end 0.40, 1.00, 1.50 (2 CPUs)" in section
    assert "**The 1-minute load was above 1 at the start**" in section


def test_gateway_section_states_added_latency_against_both_targets() -> None:
    page = render.render([doc("swap"), gateway_doc()])
    section = page[page.index("## `gateway` on") :]
    assert "| direct_saturation | 400.0 requests/s |" in section
    lines = section.splitlines()
    p50 = next(line for line in lines if line.startswith("| gateway added p50"))
    p99 = next(line for line in lines if line.startswith("| gateway added p99"))
    assert "| 0.40 ms | met |" in p50
    assert "(p99_added_seconds <= 5.00 ms) | 7.00 ms | **MISSED** |" in p99
    assert "Load average" not in section  # none recorded: nothing claimed
    assert (
        "- Why *gateway added p99 <= 5 ms* was missed: the direct path's own p99 is 20 ms "
        "at this load" in lines
    )


def test_operator_section_gives_time_to_ready_memory_and_verdict() -> None:
    page = render.render([doc("swap"), operator_doc()])
    section = page[page.index("## `operator` on") :]
    assert "Pure Python, no engine and no GPU" in section
    lines = section.splitlines()
    ready = next(line for line in lines if line.startswith("| all_placed_and_ready"))
    assert "| 95.0 s |" in ready and "ready 2000" in ready and "create_seconds 12.5 s" in ready
    steady = next(line for line in lines if line.startswith("| steady_state"))
    assert "| 0.50 writes/s |" in steady and "operator_rss_bytes 200 MiB" in steady
    verdict = next(line for line in lines if line.startswith("| 2,000 models"))
    assert "| 95.0 s | met |" in verdict


def test_targets_compute_their_verdicts() -> None:
    row = results_schema.result("x", {}, [2.0], ratio=0.85)
    results_schema.target(row, "ratio", ">=", 0.9, "ratio >= 0.9")
    results_schema.target(row, "median", "<=", 3.0, "fast", why="only a miss keeps its why")
    assert [(t["measured"], t["verdict"]) for t in row["targets"]] == [
        (0.85, "missed"),
        (2.0, "met"),
    ]
    assert "why" not in row["targets"][1]


def twin_doc() -> dict[str, Any]:
    """A twin result made by bench.twin's own row builder from two replayed records, one
    of which swapped once more for real than in the replay."""
    node = NodeShape(hbm_bytes=112 * MIB, reserve_bytes=0, per_process_overhead_bytes=0,
                     pace_bytes_per_second=1e9, swap_in_fixed_seconds=0.05,
                     swap_out_fixed_seconds=0.01)  # fmt: skip
    requests = tuple(
        Request(model=m, arrival_seconds=t, latency_seconds=0.01, correct=True)
        for m, t in (("c", 0.0), ("a", 0.2), ("b", 0.4), ("d", 1.0))
    )
    swaps = (
        SwapSeen(model="c", kind="out", seen_at_seconds=1.1, number=1),
        SwapSeen(model="d", kind="in", seen_at_seconds=1.1, number=1, seconds=0.1),
    )
    record = RunRecord(models=("a", "b", "c", "d"), weights_bytes=32 * MIB,
                       spec={"swapPolicy": {"minResident": "0s"}},
                       resident_at_start=("a", "b", "c"), requests=requests,
                       duration_seconds=1.0, swap_ins=1, swap_outs=1, swaps=swaps)  # fmt: skip
    extra = dataclasses.replace(record, swap_ins=2, swap_outs=2)
    records = [record, extra]
    judged = verdict(
        records, [replay(r, node, "follow") for r in records], [replay(r, node) for r in records]
    )
    return {
        **doc("twin", target=1e9),
        "command": twin.COMMAND,
        "results": twin.rows(records, [node, node], judged),
    }


def test_the_twin_result_renders_each_run_and_both_verdicts() -> None:
    page = render.render([twin_doc()])
    section = page[page.index("## `twin` on") :]
    assert "SCALED (paced to 1.00 GB/s)" in section
    assert "| 0 | 4 (4) | 1 / 1 | 1 / 1 |" in section and "| yes |" in section
    assert "| 1 | 4 (4) | 2 / 1 | 2 / 1 |" in section and "| **no** |" in section
    assert "swap counts equal in every run" in section and "**MISSED**" in section
    assert "median swap-in real vs simulated within max(20 %, 20 ms)" in section


def test_a_high_load_only_at_the_end_is_the_bench_s_own_and_warns_of_nothing() -> None:
    quiet_start = {
        **compare_doc(),
        "load_average": {"start": [0.3, 0.5, 0.8], "end": [1.9, 1.2, 1.0]},
    }
    page = render.render([doc("swap"), quiet_start])
    section = page[page.index("## `compare` on") :]
    assert "at start 0.30, 0.50, 0.80; at end 1.90, 1.20, 1.00 (2 CPUs)" in section
    assert "1-minute load was above" not in section


def test_a_result_from_a_tree_with_uncommitted_changes_says_so_beside_its_commit(
    tmp_path: Path,
) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "bench" / "results").mkdir(parents=True)
    for name in ("bench/gateway.py", "bench/results/x.json"):
        (tmp_path / name).write_text("one\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    commit, changed = results_schema.git_state(tmp_path)
    assert len(commit) == 40 and changed == []
    for name in ("bench/gateway.py", "bench/results/x.json"):  # a result is the bench's own
        (tmp_path / name).write_text("two\n")
    assert results_schema.git_state(tmp_path) == (commit, ["bench/gateway.py"])
    assert results_schema.git_state(tmp_path / "bench" / "nowhere") == ("", [])

    dirty = doc("swap") | {"git_uncommitted": ["bench/gateway.py"]}
    line = next(s for s in render.render([dirty]).splitlines() if "commit `" in s)
    assert "`000000000000` **plus uncommitted changes to `bench/gateway.py`**" in line
    clean = next(s for s in render.render([doc("swap")]).splitlines() if "commit `" in s)
    assert "uncommitted" not in clean
