"""`make bench-compare`: time to the first correct answer after a swap-in by modelswap vs
what users run today, side by side in one run, for the example models and a generated
1 GiB python-backend model.

- modelswap: the model was swapped out (control API); timed: `POST /v1/models/{uid}/swap-in`
  on the agent of a `modelswap up` node (sim GPUs) and then one request straight to its
  Triton, checked against examples/models/reference.py.
- unload+load: the same model code in a plain Triton with explicit model control (what
  KServe/ModelMesh-style unload-to-free does; the cold path modelswap replaces); the
  model's `modelswap_client.attach` is an in-process stand-in (bench/standalone), so a
  load reads the weights from the model's files into the process's own memory. Timed:
  `POST /v2/repository/models/<m>/load` and one checked request.
- one-at-a-time: vLLM sleep-mode wake style, the process kept: the model's bytes restored
  one allocation (32 MiB engine chunk) at a time from host memory into freshly mapped sim
  GPU memory (bench.swap.sync_baseline_seconds), plus one request to the resident model,
  both measured in the same repetition. It is a composite (the engine has no one-at-a-time
  mode to run end to end), and it is labelled as such.

The three alternate in order each repetition, so a shared machine's noise hits all alike.
Target: modelswap >= 5x faster than unload+load to the first correct answer.
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import results_schema, scratch
from bench.local_node import (
    MIB,
    ModelCase,
    check_answer,
    local_node,
    model_root,
    plain_triton,
)
from bench.swap import POOL_CHUNK_BYTES, sync_baseline_seconds
from modelswap_client import _libc
from modelswap_sidecar.allocators.sim import SimAllocator, _new_chunk_fd

ROOT = Path(__file__).resolve().parents[1]
TARGET_SPEEDUP = 5.0
#: pause after a swap-out before the timed swap-in (see _run_case): the sim pool's refill
SETTLE_SECONDS = 1.0
SETTLE_SECONDS_PER_GIB = 2.0


def cases(big_bytes: int) -> list[ModelCase]:
    found = [
        ModelCase("mlp", "mlp", 32 * MIB),
        ModelCase("tinylm", "tinylm", 64 * MIB, 4 * MIB),
    ]
    if big_bytes:
        found.append(ModelCase("big", "big", big_bytes))
    return found


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run(reps: int, big_bytes: int) -> tuple[list[dict[str, Any]], list[str]]:
    models = cases(big_bytes)
    total = sum(c.total_bytes for c in models)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    with (
        model_root(big_bytes) as root,
        # the node's run dir (its host store) in tmpfs, as DESIGN.md §4 has it; on disk,
        # writeback and page-cache faults would be booked to the swap-in
        scratch.directory("modelswap-bench-compare-", "/dev/shm") as tmp,
    ):
        work = Path(tmp)
        # the sim GPU holds every model at once (nothing is evicted to make room)
        gpu_bytes = -(-(total + 256 * MIB) // (64 * MIB)) * 64 * MIB
        with (
            local_node(models, work, gpu_bytes, root) as node,
            plain_triton(models, work, root) as plain,
        ):
            for case in models:
                plain.load(f"plain-{case.name}")
                check_answer(plain.client, case, f"plain-{case.name}")
                check_answer(node.triton, case, node.triton_name(case.name))
            for case in models:
                rows += _run_case(case, reps, node, plain)
                print(_line(rows[-4:]), flush=True)
                plain.unload(f"plain-{case.name}")  # its memory back before the next
    return rows, notes


def _run_case(case: ModelCase, reps: int, node: Any, plain: Any) -> list[dict[str, Any]]:
    name, plain_name = case.name, f"plain-{case.name}"
    swap_ins: list[float] = []
    modelswap: list[float] = []
    cold: list[float] = []
    sync_copy: list[float] = []
    resident: list[float] = []
    allocator = SimAllocator(capacities_bytes=[case.total_bytes], pool_chunk_bytes=POOL_CHUNK_BYTES)
    src_fd = _new_chunk_fd(0, case.total_bytes)  # the host copy the one-at-a-time restore reads
    src = _libc.mmap(
        0, case.total_bytes, mmap.PROT_READ, _libc.MAP_SHARED | _libc.MAP_POPULATE, src_fd
    )
    try:
        for rep in range(reps):
            for which in (
                ("modelswap", "cold", "sync") if rep % 2 == 0 else ("sync", "cold", "modelswap")
            ):
                if which == "modelswap":
                    out = node.swap(name, "out")
                    if out.get("outcome") != "completed":
                        raise RuntimeError(f"swap-out {name}: {out}")
                    # the sim GPU refills its pool (allocates and zeroes fresh chunks) in
                    # the background after a swap-out; a swap-in that finds it empty makes
                    # chunks itself (~0.4 s/GiB here), a sim artefact no GPU has. The agent
                    # exposes no pool state to wait on, so give the refill time to finish
                    time.sleep(SETTLE_SECONDS + SETTLE_SECONDS_PER_GIB * case.total_bytes / 2**30)
                    started = time.perf_counter()
                    answer = node.swap(name, "in")
                    swap_ins.append(time.perf_counter() - started)
                    if answer.get("outcome") != "completed":
                        raise RuntimeError(f"swap-in {name}: {answer}")
                    check_answer(node.triton, case, node.triton_name(name))
                    modelswap.append(time.perf_counter() - started)
                elif which == "cold":
                    plain.unload(plain_name)
                    started = time.perf_counter()
                    plain.load(plain_name)
                    check_answer(plain.client, case, plain_name)
                    cold.append(time.perf_counter() - started)
                else:
                    if not allocator.wait_pool_full(120):
                        raise RuntimeError("sim pool did not refill")
                    sync_copy.append(
                        sync_baseline_seconds(allocator, src, case.total_bytes, POOL_CHUNK_BYTES)
                    )
                    resident.append(
                        _timed(lambda: check_answer(node.triton, case, node.triton_name(name)))
                    )
    finally:
        _libc.munmap(src, case.total_bytes)
        os.close(src_fd)
        allocator.close()
    params = {"model": name, "model_bytes": case.total_bytes, "reps": reps}
    med = statistics.median
    sync_total = [c + r for c, r in zip(sync_copy, resident, strict=True)]
    swap_row = results_schema.result(
        "modelswap_swap_in_to_answer",
        params,
        modelswap,
        swap_in_call_seconds=med(swap_ins),
        speedup_vs_unload_load=med(cold) / med(modelswap),
        speedup_vs_one_at_a_time=med(sync_total) / med(modelswap),
        paired_speedup_vs_unload_load=med(c / m for c, m in zip(cold, modelswap, strict=True)),
        **results_schema.spread(modelswap),  # type: ignore[arg-type]
    )
    results_schema.target(
        swap_row,
        "speedup_vs_unload_load",
        ">=",
        TARGET_SPEEDUP,
        f"{name}: swap-in to first correct answer >= {TARGET_SPEEDUP:g}x faster than Triton "
        "unload+load",
    )
    return [
        swap_row,
        results_schema.result(
            "triton_unload_load_to_answer", params, cold, **results_schema.spread(cold)
        ),
        results_schema.result(
            "one_at_a_time_to_answer",
            params,
            sync_total,
            copy_seconds=med(sync_copy),
            resident_answer_seconds=med(resident),
        ),
        results_schema.result("resident_answer", params, resident),
    ]


def _line(rows: list[dict[str, Any]]) -> str:
    swap, cold, sync, _ = rows
    return (
        f"{swap['params']['model']:8s} {swap['params']['model_bytes'] / MIB:6.0f} MiB  modelswap "
        f"{swap['median'] * 1e3:8.1f} ms  unload+load {cold['median'] * 1e3:8.1f} ms  "
        f"one-at-a-time {sync['median'] * 1e3:8.1f} ms  "
        f"speedup {swap['metrics']['speedup_vs_unload_load']:.1f}x"
    )


NOTES = [
    "Time to the first correct answer (checked against examples/models/reference.py: MLP "
    "outputs and weights CRC; tinylm's first token and weights CRC; the big model's outputs "
    "and a CRC over 64 pages spread across its 1 GiB), medians of the repetitions.",
    "modelswap_swap_in_to_answer: the model swapped out through the control API beforehand "
    "(untimed), then a pause of 1 s + 2 s/GiB so the sim GPU's pool refills (a swap-in "
    "that finds it empty allocates and zeroes chunks itself, ~0.4 s/GiB: a sim artefact; "
    "the agent exposes no pool state to wait on); timed: POST /v1/models/{uid}/swap-in "
    "on a `modelswap up` node (sim GPUs, host store in tmpfs) plus one request straight "
    "to its Triton. swap_in_call_seconds is the swap-in call alone.",
    "triton_unload_load_to_answer: the same model code in a plain Triton (explicit model "
    "control) whose modelswap_client.attach is an in-process stand-in (bench/standalone), "
    "unloaded beforehand (untimed, until its stub is gone); timed: the repository load call "
    "(Triton starts the python-backend stub, the model reads its weight files) plus one "
    "checked request. The example models' weight files are small and tiled in memory; the "
    "big model reads its 1 GiB file (page cache, warm after the first load).",
    "one_at_a_time_to_answer (composite): the model's bytes restored one 32 MiB allocation "
    "at a time into freshly mapped sim GPU memory from host memory (copy_seconds, "
    "bench.swap's sync baseline) plus one request to the resident model "
    "(resident_answer_seconds), both measured in the same repetition.",
    "The three alternate in order every repetition (modelswap, cold, one-at-a-time, then "
    "reversed), so a shared machine's noise hits all alike.",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--big-mib", type=int, default=1024, help="the generated model (0: none)")
    p.add_argument("--no-results", action="store_true", help="print only (tests)")
    args = p.parse_args(argv)
    # SIGTERM (make, timeout) unwinds through the context managers that stop the children
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    load_start = results_schema.load_average()
    rows, notes = run(args.reps, args.big_mib * MIB)
    if args.no_results:
        return 0
    path = results_schema.write(
        "compare",
        "make bench-compare (python -m bench.compare)",
        rows,
        NOTES + notes,
        backend="sim",
        scaled=False,
        load_average_start=load_start,
    )
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
