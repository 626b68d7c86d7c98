"""`make bench-compare`: time to the first correct answer after a swap-in by modelswap vs
what users run today, side by side in one run, for the example models — the real ones
(embed: all-MiniLM-L6-v2 with its real weights; tinyllama: a Llama-architecture model),
the numpy toys — and a generated 1 GiB python-backend model; and, for the real models,
the restore after a kill of the model's process vs a fresh load after the same kill.

Swap-in, every model:
- modelswap: the model was swapped out (control API); timed: `POST /v1/models/{uid}/swap-in`
  on the agent of a `modelswap up` node (sim GPUs) and then one request straight to its
  Triton, checked (the toys against examples/models/reference.py; the real models against
  the same weights run with plain transformers in this process: embeddings within 1e-6,
  greedy tokens equal to `generate`).
- unload+load: the same model code in a plain Triton with explicit model control (what
  KServe/ModelMesh-style unload-to-free does; the cold path modelswap replaces); the
  model's `modelswap_client.attach` is an in-process stand-in (bench/standalone), so a
  load reads the weights from the model's files into the process's own memory — for the
  real models a fresh stub process imports torch and transformers and
  `modelswap_client.torch.from_pretrained` reads the safetensors (the stand-in is never
  `restored`). Timed: `POST /v2/repository/models/<m>/load` and one checked request.
- one-at-a-time: vLLM sleep-mode wake style, the process kept: the model's bytes restored
  one allocation (32 MiB engine chunk) at a time from host memory into freshly mapped sim
  GPU memory (bench.swap.sync_baseline_seconds), plus one request to the resident model,
  both measured in the same repetition. It is a composite (the engine has no one-at-a-time
  mode to run end to end), and it is labelled as such.
The three alternate in order each repetition, so a shared machine's noise hits all alike.
Target: modelswap >= 5x faster than unload+load to the first correct answer.

Restore after a kill, real models (the node's own recovery, nothing driven by the bench):
- restore: kill -9 of the model's python-backend stub; the agent sees its socket close and
  loads the model again through Triton; the new stub binds its parameters to the host copy
  (`from_pretrained` on the meta device, no weight file read: the bench has moved the
  weight files away for this path, so a load from files could not answer).
- fresh load: the same kill with the host copy unusable: the weight files' modification
  time changed first, so the committed fingerprint's source identity no longer matches and
  the stub reads the safetensors again (its "loading afresh" log line is checked) and
  commits them. It is the fair comparison: the detection, the agent's reload, the stub's
  start, its imports, building the model and its tokenizer are the same path, so the
  ratio is what the host copy saves. (A cold start of a plain Triton would add the
  server's own start and leave out the node's detection.)
Timed from the kill until the first correct answer through the gateway; a request goes
out only once the agent has seen the death (see NOTES). Alternated each repetition with a
look inside a new stub (bench/standalone/stub_phases.py, a fresh Python of the stub's
environment): its torch and transformers imports, its first build of the model (which
imports the modeling code), and `from_pretrained` loading the files vs binding a host copy
— the one step where the two paths differ.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench import results_schema, scratch
from bench.local_node import (
    MIB,
    ModelCase,
    NoAnswerError,
    check_answer,
    expect,
    hf_folder,
    local_node,
    model_root,
    plain_triton,
    real_case,
    wait_for,
)
from bench.swap import POOL_CHUNK_BYTES, sync_baseline_seconds
from modelswap_client import _libc
from modelswap_client.regions import round_up
from modelswap_sidecar.allocators.sim import SimAllocator, _new_chunk_fd

ROOT = Path(__file__).resolve().parents[1]
TARGET_SPEEDUP = 5.0
#: pause after a swap-out before the timed swap-in (see _run_case): the sim pool's refill
SETTLE_SECONDS = 1.0
SETTLE_SECONDS_PER_GIB = 2.0
#: every model the bench knows, in the order it runs them
MODELS = ("mlp", "tinylm", "big", "embed", "tinyllama")
#: a killed model must answer again within this (a stub's torch import on a busy 2-core
#: machine takes 10-20 s)
RECOVERY_LIMIT_SECONDS = 300.0
#: how often the first request after a kill is tried again while the gateway refuses it
POLL_SECONDS = 0.05
#: where a new stub's time goes (bench/standalone/stub_phases.py, run by the stub
#: environment's Python): imports, the first build, from_pretrained loading vs binding
STUB_PYTHON = ROOT / ".venv-triton" / "bin" / "python"
STUB_PHASES = Path(__file__).resolve().parent / "standalone" / "stub_phases.py"
#: the transformers class each real example's model.py builds
MODEL_CLASSES = {"embed": "AutoModel", "tinyllama": "AutoModelForCausalLM"}
#: stub_phases.py's figures, each a result row of its own: name -> its key in the output
STUB_PHASE_ROWS = {
    "stub_imports": "imports_seconds",
    "stub_first_build": "first_build_seconds",
    "stub_load_from_files": "load_seconds",
    "stub_bind_host_copy": "bind_seconds",
}
#: the client library's log line when a stub finds the host copy stale and reads its files
LOADING_AFRESH = "loading afresh"


def cases(big_bytes: int, models: tuple[str, ...] = MODELS) -> list[ModelCase]:
    found = []
    for name in models:
        if name == "mlp":
            found.append(ModelCase("mlp", "mlp", 32 * MIB))
        elif name == "tinylm":
            found.append(ModelCase("tinylm", "tinylm", 64 * MIB, 4 * MIB))
        elif name == "big":
            if big_bytes:
                found.append(ModelCase("big", "big", big_bytes))
        else:
            found.append(real_case(name))
    return found


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run(
    reps: int, real_reps: int, big_bytes: int, models: tuple[str, ...] = MODELS
) -> tuple[list[dict[str, Any]], list[str]]:
    began = time.perf_counter()
    chosen = cases(big_bytes, models)
    real = tuple(c.name for c in chosen if c.real)
    total = sum(c.total_bytes for c in chosen)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    expect(chosen)  # plain transformers' answers, before anything is timed
    with (
        model_root(big_bytes, real) as root,
        # the node's run dir (its host store) in tmpfs, as DESIGN.md §4 has it; on disk,
        # writeback and page-cache faults would be booked to the swap-in
        scratch.directory("modelswap-bench-compare-", "/dev/shm") as tmp,
    ):
        work = Path(tmp)
        # the sim GPU holds every model at once (nothing is evicted to make room)
        gpu_bytes = -(-(total + 256 * MIB) // (64 * MIB)) * 64 * MIB
        with (
            local_node(chosen, work, gpu_bytes, root) as node,
            plain_triton(chosen, work, root) as plain,
        ):
            for case in chosen:
                plain.load(f"plain-{case.name}")
                check_answer(plain.client, case, f"plain-{case.name}")
                check_answer(node.triton, case, node.triton_name(case.name))
            for case in chosen:
                rows += _run_case(case, real_reps if case.real else reps, node, plain)
                print(_line(rows[-4:]), flush=True)
                plain.unload(f"plain-{case.name}")  # its memory back before the next
            for case in chosen:
                if case.real:
                    rows += _run_restore(case, real_reps, node, root)
                    print(_restore_line(rows[-2 - len(STUB_PHASE_ROWS) :]), flush=True)
                    notes.append(_restore_note(rows[-2 - len(STUB_PHASE_ROWS) :]))
    minutes = (time.perf_counter() - began) / 60
    notes.append(
        f"This run ({', '.join(c.name for c in chosen)}; {reps} repetitions of the toys' "
        f"swap-in paths, {real_reps} of every path of the real models) took {minutes:.1f} min."
    )
    return rows, notes


def _run_case(case: ModelCase, reps: int, node: Any, plain: Any) -> list[dict[str, Any]]:
    name, plain_name = case.name, f"plain-{case.name}"
    swap_ins: list[float] = []
    modelswap: list[float] = []
    cold: list[float] = []
    sync_copy: list[float] = []
    resident: list[float] = []
    # what the engine maps for the model: each region rounded up to the 2 MiB granularity
    region_bytes = round_up(case.weights_bytes) + (round_up(case.kv_bytes) if case.kv_bytes else 0)
    allocator = SimAllocator(
        capacities_bytes=[max(region_bytes, POOL_CHUNK_BYTES)], pool_chunk_bytes=POOL_CHUNK_BYTES
    )
    src_fd = _new_chunk_fd(0, region_bytes)  # the host copy the one-at-a-time restore reads
    src = _libc.mmap(0, region_bytes, mmap.PROT_READ, _libc.MAP_SHARED | _libc.MAP_POPULATE, src_fd)
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
                        sync_baseline_seconds(allocator, src, region_bytes, POOL_CHUNK_BYTES)
                    )
                    resident.append(
                        _timed(lambda: check_answer(node.triton, case, node.triton_name(name)))
                    )
    finally:
        _libc.munmap(src, region_bytes)
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
        why=(
            f"unload+load took {med(cold):.3f} s; modelswap's {med(modelswap):.3f} s was the "
            f"swap-in call's {med(swap_ins):.3f} s and a request that took "
            f"{med(modelswap) - med(swap_ins):.3f} s (the resident model answers in "
            f"{med(resident):.3f} s)"
        ),
    )
    return [
        swap_row,
        results_schema.result(
            "triton_unload_load_to_answer",
            params,
            cold,
            **results_schema.spread(cold),  # type: ignore[arg-type]
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
        f"{swap['params']['model']:9s} {swap['params']['model_bytes'] / MIB:6.0f} MiB  modelswap "
        f"{swap['median'] * 1e3:8.1f} ms  unload+load {cold['median'] * 1e3:8.1f} ms  "
        f"one-at-a-time {sync['median'] * 1e3:8.1f} ms  "
        f"speedup {swap['metrics']['speedup_vs_unload_load']:.1f}x"
    )


# -- restore after a kill vs a fresh load (real models) ---------------------------------------


def _afresh_lines(node: Any, case: ModelCase) -> int:
    """How often the node's log says this model's stub found its host copy stale."""
    name = node.triton_name(case.name)
    return sum(1 for line in node.log().splitlines() if name in line and LOADING_AFRESH in line)


def _kill_to_answer(node: Any, case: ModelCase) -> float:
    """kill -9 of the model's stub; seconds until the first correct answer through the
    gateway. The first request goes out once the agent has seen the death (the model no
    longer Resident: its socket closed, a fraction of a second): one that reaches the dead
    stub before that is answered 500 by Triton, whose unload of the model then stalls (see
    NOTES). The gateway refuses requests (503) while the model is pending or loading, so
    the polling never reaches Triton."""
    stubs = node.stub_pids(case.name)
    if len(stubs) != 1:
        raise RuntimeError(f"{case.name}: {len(stubs)} stub processes, expected one")
    started = time.perf_counter()
    os.kill(stubs[0], signal.SIGKILL)
    wait_for(
        lambda: node.models()[case.name]["state"] != "Resident",
        30,
        f"the agent to see {case.name}'s stub die",
    )
    while True:
        try:
            check_answer(node.gateway, case, case.name)  # the gateway routes the user's name
        except (NoAnswerError, httpx.TransportError) as e:
            if time.perf_counter() - started > RECOVERY_LIMIT_SECONDS:
                raise TimeoutError(
                    f"{case.name} did not answer {RECOVERY_LIMIT_SECONDS:.0f} s after its "
                    f"stub was killed: {e}\n{node.log()[-4000:]}"
                ) from None
            time.sleep(POLL_SECONDS)
            continue
        elapsed = time.perf_counter() - started
        # the next kill must find the new stub
        wait_for(lambda: len(node.stub_pids(case.name)) == 1, 60, f"{case.name}'s one stub")
        return elapsed


def _stub_phases(case: ModelCase, folder: Path) -> dict[str, float]:
    """Where a new stub of `case` spends its time (stub_phases.py in a fresh Python of the
    stub's environment, over the model's Hugging Face folder `folder`)."""
    import modelswap_client  # noqa: PLC0415 - only to name the real package's folder

    real = str(Path(modelswap_client.__file__).resolve().parent)
    command = [str(STUB_PYTHON), str(STUB_PHASES), real, MODEL_CLASSES[case.name], str(folder)]
    done = subprocess.run(
        [*command, str(case.weights_bytes)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{case.name}: stub_phases.py failed: {done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _run_restore(case: ModelCase, reps: int, node: Any, root: Path) -> list[dict[str, Any]]:
    weights = sorted(hf_folder(root, case.name).glob("*.safetensors"))
    if not weights:
        raise RuntimeError(f"{case.name}: no safetensors in {hf_folder(root, case.name)}")
    away = root / "away" / case.name
    away.mkdir(parents=True)
    restore: list[float] = []
    fresh: list[float] = []
    phases: dict[str, list[float]] = {name: [] for name in STUB_PHASE_ROWS}
    for rep in range(reps):
        for which in (
            ("restore", "fresh", "phases") if rep % 2 == 0 else ("phases", "fresh", "restore")
        ):
            stale_before = _afresh_lines(node, case)
            if which == "restore":
                # no weight file to read: only the host copy can bring the model back
                for path in weights:
                    path.rename(away / path.name)
                try:
                    restore.append(_kill_to_answer(node, case))
                finally:
                    for path in weights:
                        (away / path.name).rename(path)
                if _afresh_lines(node, case) != stale_before:
                    raise RuntimeError(f"{case.name}: the restore found its host copy stale")
            elif which == "fresh":
                # a new modification time: the committed source identity no longer matches
                for path in weights:
                    info = path.stat()
                    mtime_ns = max(info.st_mtime_ns + 10**9, time.time_ns())
                    os.utime(path, ns=(info.st_atime_ns, mtime_ns))
                fresh.append(_kill_to_answer(node, case))
                wait_for(
                    lambda: _afresh_lines(node, case) > stale_before,  # noqa: B023 - called here
                    30,
                    f"{case.name}'s stub to log that it loaded afresh",
                )
            else:
                figures = _stub_phases(case, hf_folder(root, case.name))
                for name, key in STUB_PHASE_ROWS.items():
                    phases[name].append(figures[key])
    params = {"model": case.name, "model_bytes": case.total_bytes, "reps": reps}
    med = statistics.median
    metrics: dict[str, float] = {
        "speedup_vs_fresh_load": med(fresh) / med(restore),
        "paired_speedup_vs_fresh_load": med(f / r for f, r in zip(fresh, restore, strict=True)),
        **{f"{name}_seconds": med(samples) for name, samples in phases.items()},
        **results_schema.spread(restore),
    }
    return [
        results_schema.result("restore_after_kill_to_answer", params, restore, **metrics),  # type: ignore[arg-type]
        results_schema.result(
            "fresh_load_after_kill_to_answer",
            params,
            fresh,
            **results_schema.spread(fresh),  # type: ignore[arg-type]
        ),
        *(
            results_schema.result(
                name,
                params,
                samples,
                **results_schema.spread(samples),  # type: ignore[arg-type]
            )
            for name, samples in phases.items()
        ),
    ]


def _restore_note(rows: list[dict[str, Any]]) -> str:
    """What the host copy saved after a kill, in this run's figures."""
    restore, fresh = rows[:2]
    m = restore["metrics"]
    saved = m["stub_load_from_files_seconds"] - m["stub_bind_host_copy_seconds"]
    r, f = sorted(restore["samples"]), sorted(fresh["samples"])
    noise = max(r[-1] - r[0], f[-1] - f[0])  # how much one path's repetitions differ
    return (
        f"{restore['params']['model']}: restore after a kill {restore['median']:.2f} s vs "
        f"fresh load {fresh['median']:.2f} s ({m['speedup_vs_fresh_load']:.2f}x). Both paths "
        f"start a new stub, which spent {m['stub_imports_seconds']:.2f} s importing torch and "
        f"transformers and {m['stub_first_build_seconds']:.2f} s on the model's first build; "
        f"the one step that differs, from_pretrained, took {m['stub_load_from_files_seconds']:.3f}"
        f" s loading the files vs {m['stub_bind_host_copy_seconds']:.3f} s binding the host "
        f"copy: the host copy saves about {saved:.2f} s ({saved / fresh['median']:.0%} of the "
        f"fresh load), less than one path's repetitions differ here (restore {r[0]:.1f} to "
        f"{r[-1]:.1f} s, fresh load {f[0]:.1f} to {f[-1]:.1f} s)."
        if saved < noise
        else f"{restore['params']['model']}: restore after a kill {restore['median']:.2f} s "
        f"vs fresh load {fresh['median']:.2f} s ({m['speedup_vs_fresh_load']:.2f}x); inside a "
        f"new stub from_pretrained took {m['stub_load_from_files_seconds']:.3f} s loading the "
        f"files vs {m['stub_bind_host_copy_seconds']:.3f} s binding the host copy, after "
        f"{m['stub_imports_seconds']:.2f} s of imports and {m['stub_first_build_seconds']:.2f}"
        " s of first build that both paths pay."
    )


def _restore_line(rows: list[dict[str, Any]]) -> str:
    restore, fresh = rows[:2]
    m = restore["metrics"]
    return (
        f"{restore['params']['model']:9s} {restore['params']['model_bytes'] / MIB:6.0f} MiB  "
        f"restore after kill {restore['median']:6.2f} s  fresh load after kill "
        f"{fresh['median']:6.2f} s  speedup {m['speedup_vs_fresh_load']:.2f}x  in a new stub: "
        f"imports {m['stub_imports_seconds']:.2f} s, first build "
        f"{m['stub_first_build_seconds']:.2f} s, load {m['stub_load_from_files_seconds']:.3f} s "
        f"vs bind {m['stub_bind_host_copy_seconds']:.3f} s"
    )


NOTES = [
    "Time to the first correct answer, medians of the repetitions. Checked: the real models "
    "against the same weights run with plain transformers in the bench's process (embed: "
    "two texts' embeddings within 1e-6 and their token counts; tinyllama: 8 greedy tokens "
    "equal to transformers' generate); the toys against examples/models/reference.py (MLP "
    "outputs and weights CRC; tinylm's first token and weights CRC; the big model's outputs "
    "and a CRC over 64 pages spread across its 1 GiB).",
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
    "checked request. For the real models that is what users run today: a fresh stub "
    "imports torch and transformers and from_pretrained reads the safetensors (the "
    "stand-in attachment is never restored). The toys' weight files are small and tiled in "
    "memory; the big model reads its 1 GiB file (page cache, warm after the first load).",
    "one_at_a_time_to_answer (composite): the model's bytes restored one 32 MiB allocation "
    "at a time into freshly mapped sim GPU memory from host memory (copy_seconds, "
    "bench.swap's sync baseline) plus one request to the resident model "
    "(resident_answer_seconds), both measured in the same repetition.",
    "The three alternate in order every repetition (modelswap, cold, one-at-a-time, then "
    "reversed), so a shared machine's noise hits all alike.",
    "restore_after_kill_to_answer (real models): kill -9 of the model's python-backend stub "
    "on the modelswap node; the agent sees its socket close, loads the model again through "
    "Triton, and the new stub binds its parameters to the host copy (built on the meta "
    "device; the weight files are moved away for this path, so only the host copy can "
    "answer). fresh_load_after_kill_to_answer: the same kill after the weight files' "
    "modification time changed, so the committed fingerprint no longer matches and the stub "
    "reads the safetensors again and commits them (its 'loading afresh' log line checked). "
    "Both timed from the kill to the first correct answer through the gateway, the same "
    "node path apart from binding vs reading the files: the ratio is what the host copy "
    "saves. Inside a new stub (bench/standalone/stub_phases.py: a fresh Python of the "
    "stub's environment, the stand-in attachment, no agent): stub_imports, importing torch "
    "and transformers' Auto classes; stub_first_build, the first build of the model on the "
    "meta device (transformers imports its modeling code then); stub_load_from_files and "
    "stub_bind_host_copy, from_pretrained reading the safetensors into the region vs binding "
    "bytes already there (reported restored with their fingerprint): the one step where "
    "restore and fresh load differ. The three alternate in order every repetition.",
    "After a kill the bench sends its first request only once the agent has seen the stub "
    "die (its model no longer Resident, a fraction of a second later): a request that "
    "reached the dead stub before that was answered 500 by Triton, and Triton's unload of "
    "that model then stayed UNLOADING until the agent's 60 s unload timeout, which delayed "
    "the recovery by a minute (seen while building this bench; it is the node's behaviour, "
    "not measured here). Through the gateway a request to a model that is pending or loading "
    "is refused 503 at once, so the polling (every 50 ms) never reaches Triton.",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--reps", type=int, default=5, help="repetitions of the toys' swap-in paths")
    p.add_argument(
        "--real-reps",
        type=int,
        default=3,
        help="repetitions of every path of the real models (each starts stubs that import "
        "torch: 10-20 s apiece on 2 busy cores)",
    )
    p.add_argument("--big-mib", type=int, default=1024, help="the generated model (0: none)")
    p.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"comma-separated, of {', '.join(MODELS)} (default: all)",
    )
    p.add_argument("--no-results", action="store_true", help="print only (tests)")
    args = p.parse_args(argv)
    models = tuple(m for m in args.models.split(",") if m)
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        p.error(f"unknown models {unknown}: choose from {', '.join(MODELS)}")
    # SIGTERM (make, timeout) unwinds through the context managers that stop the children
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    load_start = results_schema.load_average()
    rows, notes = run(args.reps, args.real_reps, args.big_mib * MIB, models)
    print(notes[-1])
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
