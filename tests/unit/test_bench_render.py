"""docs/BENCHMARKS.md says which figures are scaled and which benches have not run."""

from __future__ import annotations

from typing import Any

import pytest

from bench import render, results_schema

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
    simulated = [{**doc("swap"), "bench": name, "results": []} for name in ("sim", "sim-grid")]
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
