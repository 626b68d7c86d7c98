"""`make bench-swap`: swap-in/out latency and throughput of the sim engine, 64 MiB-1 GiB.

For each model size the sim GPU is sized to the model. An in-process engine serves a
separate client process over the real socket; the bench swaps the model out and in
REPS times and takes medians. In the same run it measures:

- the ceiling: a plain copy of the same bytes from the model's host-store file (mapped
  read-only with MAP_POPULATE, untimed) into a freshly created, pre-populated memfd chunk
  of the same size, freshly mapped MAP_SHARED|MAP_POPULATE (the map is timed with the
  copy); one thread, one memmove, no protocol;
- the synchronous baseline: the same bytes moved one allocation (engine chunk) at a
  time, each created, mapped and copied before the next starts (how vLLM's wake-up
  copies).

All four run side by side in every repetition (see NOTES). History: the first version
measured the ceiling after the swaps, while the pool refilled in the background, into a
chunk whose pages `posix_fallocate` had left unzeroed (the kernel zeroes a shmem page on
its first fault), so its "copy" was mostly page zeroing under contention (0.31 GB/s at
1 GiB). Pool chunks are now zeroed when made (`sim._new_chunk_fd`).

Ratios are time ratios: ceiling seconds / swap-in seconds (1.0 = as fast as the ceiling).

`--pace-gbps X` runs the same bench with the client's sim mapper paced to an emulated X GB/s
link (`modelswap_client.mappers.sim.Pacer`: every copy stream shares that one link) and
the synchronous baseline paced alike; it writes `swap-paced.json`, marked `scaled: true`
with the target. Its ceiling is the link itself (model bytes / X); the machine's own copy
ceiling is still measured, and X must stay below it (this machine copies at ~7-17 GB/s,
so e.g. 2 GB/s emulates a slow PCIe link; 55 GB/s cannot be paced here).

SIGTERM and SIGINT end the run cleanly: the client process group is killed and the work
directory under /dev/shm removed (nothing is written).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import ctypes
import mmap
import os
import pstats
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench import results_schema, scratch
from modelswap_client import _libc
from modelswap_client.mappers.sim import Pacer
from modelswap_sidecar.allocators.base import Location
from modelswap_sidecar.allocators.sim import SimAllocator, _new_chunk_fd
from modelswap_sidecar.engine.core import Engine, EngineSettings
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import ModelConfig
from modelswap_sidecar.engine.server import EngineServer
from modelswap_sidecar.engine.vouching import RegisteredVoucher

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
#: the sim default (and minimum): a model spans several chunks, so copying one overlaps
#: granting access to (populating) the next
POOL_CHUNK_BYTES = 32 * MIB
#: untimed swap-ins profiled after the timed ones (smallest size only)
PROFILE_CYCLES = 5
PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE


def _map(fd: int, size: int, prot: int) -> int:
    return _libc.mmap(0, size, prot, _libc.MAP_SHARED | _libc.MAP_POPULATE, fd)


def _pool_full(allocator: SimAllocator) -> None:
    """Every timed step starts with the pool refilled, so no background zeroing competes."""
    if not allocator.wait_pool_full(120):
        raise RuntimeError("sim pool did not refill")


class PhaseClock:
    """The engine's checkpoint hook, used as a stopwatch: the time each named point was
    passed, so a swap-in splits into allocating (chunks made and exported), the `map`
    round trip (the client mapped them, no access yet) and the `restore` round trip
    (access granted, bytes copied, reply), without a profiler slowing what it watches."""

    def __init__(self) -> None:
        self.passed: dict[str, float] = {}

    def __call__(self, name: str) -> None:
        self.passed[name] = time.perf_counter()

    def swap_in_phases(self, started: float, ended: float) -> tuple[float, float, float]:
        """(allocate, map round trip, restore round trip) seconds of the swap-in that ran
        from `started` to `ended`."""
        allocated = self.passed["swap_in.allocated"]
        mapped = self.passed["swap_in.mapped"]
        if not started <= allocated <= mapped <= ended:
            raise RuntimeError("the swap-in passed its checkpoints out of order")
        return allocated - started, mapped - allocated, ended - mapped


#: the ways the ceiling tries to move the bytes (each with 1..cores threads): one mapping of
#: the model's size; one mapping per engine-sized chunk, each mapped and copied by one of the
#: threads; or one extra thread mapping the chunks in order while the threads copy each as
#: soon as it is mapped (the swap-in's own pipeline: grant, then copy streams)
CEILING_LAYOUTS = ("whole", "chunks", "pipelined")


def ceiling_means(cores: int | None = None) -> list[tuple[int, str]]:
    """Every (threads, layout) the ceiling tries: 1..cores threads, each layout."""
    n = cores or os.cpu_count() or 1
    return [(t, layout) for t in range(1, n + 1) for layout in CEILING_LAYOUTS]


def _run_threads(work: list[Any], threads: int) -> None:
    """Run the callables in `work` on `threads` threads (ctypes calls drop the GIL), each
    thread taking every threads-th item; returns when all are done."""
    if threads == 1:
        for job in work:
            job()
        return
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for job in work[i::threads]:
                job()
        except BaseException as e:  # re-raised in the caller
            errors.append(e)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def ceiling_seconds(src: int, size: int, threads: int = 1, layout: str = "whole") -> float:
    """Move `size` bytes from `src` into freshly mapped, pre-populated memfd memory (timed:
    the mapping MAP_SHARED|MAP_POPULATE and the memmoves), `threads` at a time.

    "whole": one chunk of `size`, mapped once, the copy split across the threads.
    "chunks": one chunk per POOL_CHUNK_BYTES, each mapped and copied by one thread.
    "pipelined": the same chunks, mapped in order by one more thread and each copied by
    the first of the `threads` free once it is mapped.
    The chunks are created and zeroed before the timing, like the engine's pool."""
    piece = size if layout == "whole" else POOL_CHUNK_BYTES
    sizes = [min(piece, size - off) for off in range(0, size, piece)]
    fds = [_new_chunk_fd(0, n) for n in sizes]
    mapped: list[tuple[int, int]] = []
    try:
        started = time.perf_counter()
        if layout == "whole":
            dst = _map(fds[0], size, PROT_RW)
            mapped.append((dst, size))
            step = -(-size // threads)
            slices = [(off, min(step, size - off)) for off in range(0, size, step)]
            _run_threads(
                [lambda o=o, n=n: ctypes.memmove(dst + o, src + o, n) for o, n in slices], threads
            )
        elif layout == "chunks":

            def one(i: int) -> None:
                addr = _map(fds[i], sizes[i], PROT_RW)
                mapped.append((addr, sizes[i]))  # list.append is atomic under the GIL
                ctypes.memmove(addr, src + i * piece, sizes[i])

            _run_threads([lambda i=i: one(i) for i in range(len(sizes))], threads)
        else:
            _pipelined(src, fds, sizes, threads, mapped)
        elapsed = time.perf_counter() - started
    finally:
        for addr, n in mapped:
            _libc.munmap(addr, n)
        for fd in fds:
            os.close(fd)
    return elapsed


def _pipelined(
    src: int, fds: list[int], sizes: list[int], threads: int, mapped: list[tuple[int, int]]
) -> None:
    """One thread maps the chunks in order; `threads` copy each as soon as it is mapped."""
    ready: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()

    def mapper() -> None:
        try:
            for i, n in enumerate(sizes):
                addr = _map(fds[i], n, PROT_RW)
                mapped.append((addr, n))
                ready.put((i, addr))
        finally:
            for _ in range(threads):
                ready.put(None)

    def copier() -> None:
        while (item := ready.get()) is not None:
            i, addr = item
            ctypes.memmove(addr, src + i * POOL_CHUNK_BYTES, sizes[i])

    _run_threads([mapper, *([copier] * threads)], threads + 1)


def source_map_seconds(weights: Path, size: int) -> float:
    """What mapping the host-store file read-only with MAP_POPULATE costs (not in the ceiling)."""
    fd = os.open(weights, os.O_RDONLY)
    try:
        started = time.perf_counter()
        addr = _map(fd, size, mmap.PROT_READ)
        elapsed = time.perf_counter() - started
        _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return elapsed


def sync_baseline_seconds(
    allocator: SimAllocator, src: int, size: int, piece: int, pace_bytes_per_second: float = 0.0
) -> float:
    """One allocation at a time from the engine's own pool: create, export, map, copy, next
    (each copy paced to the same emulated link as the client's when pacing)."""
    chunks = []
    pacer = Pacer(pace_bytes_per_second) if pace_bytes_per_second > 0 else None
    try:
        started = time.perf_counter()
        for offset in range(0, size, piece):
            n = min(piece, size - offset)
            chunk = allocator.create(Location.device(0), n)
            fd = allocator.export_fd(chunk)
            dst = _map(fd, n, PROT_RW)
            os.close(fd)
            chunks.append((chunk, dst, n))
            deadline = pacer.reserve(n) if pacer is not None else 0.0
            ctypes.memmove(dst, src + offset, n)
            if pacer is not None:
                pacer.wait_until(deadline)
        elapsed = time.perf_counter() - started
    finally:
        for chunk, dst, n in chunks:
            _libc.munmap(dst, n)
            allocator.release(chunk)
    return elapsed


def _profile_swap_in(engine: Engine, allocator: SimAllocator, cycles: int = 5) -> str:
    """Where the agent's side of a swap-in spends its time: cProfile over `cycles` untimed
    swap-ins (the engine runs in this process; the client's copies show up as the wait for
    its reply). The top functions by own time, as text for the results' notes."""
    profiler = cProfile.Profile()
    for _ in range(cycles):
        _pool_full(allocator)
        engine.swap_out("bench")
        _pool_full(allocator)
        profiler.enable()
        engine.swap_in("bench")
        profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt / cycles  # type: ignore[attr-defined]
    rows = sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda kv: kv[1][2],
        reverse=True,
    )[:8]
    parts = []
    for (file, line, func), (_cc, _nc, tt, _ct, _callers) in rows:
        where = f"{Path(file).name}:{line}" if line else file
        parts.append(f"{func} ({where}) {tt / cycles * 1e3:.2f} ms")
    return f"{total * 1e3:.2f} ms per swap-in in the agent's thread; by own time: " + "; ".join(
        parts
    )


_BLOCKING = frozenset(
    {
        "<method 'get' of '_queue.SimpleQueue' objects>",
        "<method 'acquire' of '_thread.lock' objects>",
        "<method 'recvmsg' of '_socket.socket' objects>",
        "<method 'recv' of '_socket.socket' objects>",
        "<method 'read' of '_io.TextIOWrapper' objects>",
    }
)


def _client_profile(path: Path, swap_ins: int) -> str:
    """The client process's threads (its swap handling and copy streams), per swap-in."""
    stats = pstats.Stats(str(path))
    rows = sorted(
        (
            kv
            for kv in stats.stats.items()  # type: ignore[attr-defined]
            # idle threads block in these between swaps: waiting, not work
            if kv[0][2] not in _BLOCKING
        ),
        key=lambda kv: kv[1][2],
        reverse=True,
    )[:8]
    parts = [
        f"{func} ({Path(file).name}:{line}) {tt / swap_ins * 1e3:.2f} ms"
        for (file, line, func), (_cc, _nc, tt, _ct, _callers) in rows
    ]
    return (
        "client threads, own time per swap-in (swap-outs included, blocking waits left "
        "out, profiler overhead included): " + "; ".join(parts)
    )


def fixed_cost(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Least-squares line through (model bytes, median seconds) of the swap-ins and of the
    ceilings: the intercept is the fixed cost per swap-in, the slope the bytes' cost."""
    ins = [(r["params"]["model_bytes"], r["median"]) for r in rows if r["name"] == "swap_in"]
    ceil = [(r["params"]["model_bytes"], r["median"]) for r in rows if r["name"] == "ceiling_copy"]
    if len(ins) < 2 or len(ceil) < 2:
        return None

    def line(points: list[tuple[int, float]]) -> tuple[float, float]:
        slope, intercept = statistics.linear_regression(
            [float(x) for x, _ in points], [y for _, y in points]
        )
        return slope, intercept

    s_in, i_in = line(ins)
    s_c, i_c = line(ceil)
    return results_schema.result(
        "fixed_cost",
        {"sizes_bytes": [x for x, _ in ins]},
        [i_in],
        swap_in_intercept_seconds=i_in,
        ceiling_intercept_seconds=i_c,
        swap_in_marginal_bytes_per_second=1 / s_in if s_in > 0 else 0.0,
        ceiling_marginal_bytes_per_second=1 / s_c if s_c > 0 else 0.0,
    )


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the client's whole process group (it runs in its own session) and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()


def run_size(
    size: int,
    reps: int,
    workdir: Path,
    pace_bytes_per_second: float = 0.0,
    *,
    profile: bool = False,
    profile_out: list[str] | None = None,
) -> list[dict[str, Any]]:
    allocator = SimAllocator(capacities_bytes=[size], pool_chunk_bytes=POOL_CHUNK_BYTES)
    store = HostStore(workdir / f"store-{size}", {0: size})
    voucher = RegisteredVoucher()
    clock = PhaseClock()
    engine = Engine(
        allocator,
        store,
        voucher,
        EngineSettings(),
        checkpoint=clock,
        decider=lambda name: engine.swap_in(name),  # noqa: PLW0108 - built by this call
    )
    engine.add_model(ModelConfig("bench", 0))
    sock = workdir / f"agent-{size}.sock"
    server = EngineServer(engine, sock)
    server.start()
    client = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.swap_client",
            str(sock),
            str(size),
            str(pace_bytes_per_second),
            *([str(workdir / f"client-{size}.pstats")] if profile else []),
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    src = src_fd = 0
    try:
        voucher.register(client.pid, "bench")
        assert client.stdout is not None and client.stdin is not None
        if client.stdout.readline().strip() != "ready":
            raise RuntimeError("bench client did not start")
        print(f"started {size // MIB} MiB: client pid {client.pid}", flush=True)
        weights = next((workdir / f"store-{size}").rglob("*.weights"))
        src_fd = os.open(weights, os.O_RDONLY)
        src = _map(src_fd, size, mmap.PROT_READ)  # the ceiling's source, mapped once
        outs: list[float] = []
        ins: list[float] = []
        ceilings: list[float] = []
        means = ceiling_means()
        by_means: dict[tuple[int, str], list[float]] = {m: [] for m in means}
        baselines: list[float] = []
        source_maps: list[float] = []
        phases: list[tuple[float, float, float]] = []
        client_copies: list[float] = []
        # one untimed cycle first: the client maps its host copy once (it keeps that
        # mapping between swap-ins) and every later cycle is the steady state
        engine.swap_out("bench")
        _pool_full(allocator)
        engine.swap_in("bench")
        for rep in range(reps):
            # every measurement of a repetition runs side by side with the others, each
            # after the pool refilled, so the shared machine's noise hits all alike; the
            # order rotates so no way of copying always runs first or last
            _pool_full(allocator)
            t = time.perf_counter()
            engine.swap_out("bench")
            outs.append(time.perf_counter() - t)
            steps: list[tuple[int, str] | str] = [*means, "sync"]
            shift = rep % len(steps)
            for which in steps[shift:] + steps[:shift]:
                _pool_full(allocator)
                if which == "sync":
                    baselines.append(
                        sync_baseline_seconds(
                            allocator, src, size, POOL_CHUNK_BYTES, pace_bytes_per_second
                        )
                    )
                else:
                    assert not isinstance(which, str)
                    by_means[which].append(ceiling_seconds(src, size, *which))
            # this repetition's ceiling: the fastest way any means moved the bytes
            ceilings.append(min(v[-1] for v in by_means.values()))
            source_maps.append(source_map_seconds(weights, size))
            _pool_full(allocator)
            t = time.perf_counter()
            engine.swap_in("bench")
            ended = time.perf_counter()
            ins.append(ended - t)
            phases.append(clock.swap_in_phases(t, ended))
            client_copies.append(engine.status("bench").last_swap_in_copy.seconds)
        profile_text = ""
        if profile:
            profile_text = _profile_swap_in(engine, allocator, PROFILE_CYCLES)
        client.stdin.close()
        verdict = client.stdout.readline().strip()
        if verdict != "ok":
            raise RuntimeError(f"bytes did not survive the swaps: {verdict}")
        if profile:
            client.wait(timeout=60)  # it writes its profile after answering
    finally:
        if src:
            _libc.munmap(src, size)
        if src_fd:
            os.close(src_fd)
        _kill_group(client)
        server.close()
        engine.close()
        allocator.close()
    med_in, med_out = statistics.median(ins), statistics.median(outs)
    med_ceiling, med_base = statistics.median(ceilings), statistics.median(baselines)
    params: dict[str, Any] = {
        "model_bytes": size,
        "pool_chunk_bytes": POOL_CHUNK_BYTES,
        "reps": reps,
    }
    paired_sync = statistics.median(b / i for b, i in zip(baselines, ins, strict=True))
    if profile_out is not None and profile_text:
        profile_out.append(profile_text)
        swap_ins = reps + 1 + PROFILE_CYCLES  # every swap-in the client handled
        profile_out.append(_client_profile(workdir / f"client-{size}.pstats", swap_ins))
    best = min(by_means, key=lambda m: statistics.median(by_means[m]))
    machine_row = results_schema.result(
        "ceiling_copy",
        {**params, "means_tried": [f"{t} thread(s), {layout}" for t, layout in means]},
        ceilings,
        throughput_bytes_per_second=size / med_ceiling,
        source_map_seconds=statistics.median(source_maps),
        best_means_threads=best[0],
    )
    machine_row["params"]["best_means"] = f"{best[0]} thread(s), {best[1]}"
    means_rows = [
        results_schema.result(
            f"copy_{t}t_{layout}",
            {**params, "threads": t, "layout": layout},
            v,
            throughput_bytes_per_second=size / statistics.median(v),
        )
        for (t, layout), v in by_means.items()
    ]
    swap_out_row = results_schema.result(
        "swap_out", params, outs, throughput_bytes_per_second=size / med_out
    )
    phase_metrics = _phase_metrics(phases, client_copies)
    if pace_bytes_per_second <= 0:
        swap_in_row = results_schema.result(
            "swap_in",
            params,
            ins,
            throughput_bytes_per_second=size / med_in,
            ratio_to_ceiling=med_ceiling / med_in,
            ratio_to_sync_baseline=med_base / med_in,
            # the same ratios per repetition (each pair measured side by side), median
            paired_ratio_to_ceiling=statistics.median(
                c / i for c, i in zip(ceilings, ins, strict=True)
            ),
            paired_ratio_to_sync_baseline=paired_sync,
            **phase_metrics,
        )
        results_schema.target(
            swap_in_row,
            "ratio_to_ceiling",
            ">=",
            0.9,
            f"sim swap-in at {size // MIB} MiB >= 0.9 of the same-run ceiling",
            why=_why_short_of_ceiling(
                med_in, phase_metrics, by_means, med_ceiling, machine_row["params"]["best_means"]
            ),
        )
        return [
            swap_in_row,
            swap_out_row,
            machine_row,
            results_schema.result(
                "sync_one_at_a_time", params, baselines, throughput_bytes_per_second=size / med_base
            ),
            *means_rows,
        ]
    if pace_bytes_per_second >= size / med_ceiling:
        raise RuntimeError(
            f"cannot pace to {pace_bytes_per_second / 1e9:.2f} GB/s: this machine copies only "
            f"{size / med_ceiling / 1e9:.2f} GB/s at {size // MIB} MiB; pace below its ceiling"
        )
    # paced: the ceiling is the emulated link itself (every byte at the target rate); the
    # machine's own copy ceiling stays beside it, to show the pace is below it
    link_seconds = size / pace_bytes_per_second
    paced = {**params, "pace_bytes_per_second": pace_bytes_per_second}
    machine_row["metrics"]["pace_fraction_of_machine_ceiling"] = (
        pace_bytes_per_second * med_ceiling / size
    )
    return [
        results_schema.result(
            "swap_in",
            paced,
            ins,
            throughput_bytes_per_second=size / med_in,
            ratio_to_ceiling=link_seconds / med_in,
            ratio_to_sync_baseline=med_base / med_in,
            link_seconds=link_seconds,
            paired_ratio_to_sync_baseline=paired_sync,
            **phase_metrics,
        ),
        swap_out_row,
        machine_row,
        results_schema.result(
            "sync_one_at_a_time", paced, baselines, throughput_bytes_per_second=size / med_base
        ),
    ]


def _phase_metrics(
    phases: list[tuple[float, float, float]], client_copies: list[float]
) -> dict[str, float]:
    """Medians of where the swap-ins' time went (see PhaseClock); `client_copy_seconds`
    is the client's own measure of its restore (access granted and bytes copied), so the
    restore round trip less it is the messages' and the threads' hand-offs."""
    allocate, map_trip, restore_trip = (statistics.median(p) for p in zip(*phases, strict=True))
    return {
        "allocate_seconds": allocate,
        "map_round_trip_seconds": map_trip,
        "restore_round_trip_seconds": restore_trip,
        "client_copy_seconds": statistics.median(client_copies),
    }


def _why_short_of_ceiling(
    swap_in_seconds: float,
    phases: dict[str, float],
    by_means: dict[tuple[int, str], list[float]],
    ceiling_seconds: float,
    best_means: str,
) -> str:
    """Where the swap-in's time went against the ceiling, in this run's medians."""
    threads = max(t for t, _ in by_means)
    pipelined = statistics.median(by_means[(threads, "pipelined")])
    return (
        f"the swap-in took {swap_in_seconds * 1e3:.1f} ms: allocating "
        f"{phases['allocate_seconds'] * 1e3:.1f} ms, the map round trip "
        f"{phases['map_round_trip_seconds'] * 1e3:.1f} ms, the restore round trip "
        f"{phases['restore_round_trip_seconds'] * 1e3:.1f} ms, of which the client granted "
        f"access and copied for {phases['client_copy_seconds'] * 1e3:.1f} ms. The ceiling's "
        f"run of that same pipeline (copy_{threads}t_pipelined) took {pipelined * 1e3:.1f} ms, "
        f"its fastest means ({best_means}) {ceiling_seconds * 1e3:.1f} ms; 0.9 of the "
        f"ceiling leaves {ceiling_seconds / 0.9 * 1e3:.1f} ms for the whole swap-in."
    )


NOTES = [
    "Backend sim: 'HBM' is memfd chunks in host memory; copies are real memmoves, not paced "
    "(scaled: false). Figures describe the engine's overhead on this CPU, not a GPU link.",
    "Ceiling (honest, same run): the fastest this machine moved the model's bytes from its "
    "host-store file (mapped read-only with MAP_POPULATE before timing) into freshly "
    "created, pre-populated (allocated and zeroed) memfd memory, freshly mapped "
    "MAP_SHARED|MAP_POPULATE (the mapping is timed with the copy), by every means tried: "
    "1..cores threads x (one mapping of the model's size, the copy split across the "
    "threads | one mapping per 32 MiB engine chunk, each mapped and copied by one thread, "
    "so mapping one overlaps copying another | the same chunks mapped in order by one more "
    "thread while the threads copy each as soon as it is mapped, the swap-in's own "
    "pipeline). Each repetition measures every means "
    "(rows copy_<threads>t_<layout>) and its ceiling is the fastest of them; ceiling_copy "
    "is the median of those. A ratio_to_ceiling above 1 would be a measurement error. "
    "Mapping the source file is not in the ceiling (source_map_seconds); the client maps "
    "each weight copy once and keeps that read-only mapping between swap-ins.",
    "fixed_cost: least-squares lines through (model bytes, median seconds) of the swap-ins "
    "and of the ceilings over the sizes run: the intercept is the per-swap-in fixed cost, "
    "1/slope the marginal throughput. The profiles below come from a separate, untimed "
    "run of the smallest size (profilers slow what they watch).",
    "Sync baseline: the same bytes one allocation (engine chunk, pool_chunk_bytes) at a "
    "time from the engine's own pre-populated pool: create, export, map MAP_POPULATE, copy, "
    "then the next, in one thread (how vLLM's sleep-mode wake-up copies).",
    "Each repetition measures swap-out, every ceiling means and the sync baseline (their "
    "order rotating from one repetition to the next) and swap-in side by side, each after "
    "the pool refilled, so the shared machine's noise hits all alike; one untimed swap "
    "cycle runs first. Medians of the repetitions.",
    "ratio_to_ceiling and ratio_to_sync_baseline are reference seconds / swap-in seconds "
    "(medians); > 1 means the swap-in was faster than the reference. paired_ratio_* are "
    "the median of the per-repetition ratios (each pair measured side by side).",
    "swap_in = engine.swap_in(): allocate from the pre-populated pool, export fds over "
    "SCM_RIGHTS, client maps them PROT_NONE at its reserved addresses (one message), then "
    "(second message) queues chunk i's grant (sim: re-map MAP_POPULATE) and then its "
    "memmoves from the host copy on copy stream i mod 2, so the 2 streams grant and copy "
    "their own chunks side by side, replies. swap_out "
    "= quiesce, unmap, release (weights are clean); it is dominated by the kernel freeing "
    "the chunks' pages when the agent closes the last fd.",
    "Where each timed swap-in's time went (medians, from the engine's checkpoints, no "
    "profiler): allocate_seconds (chunks made and exported), map_round_trip_seconds (the "
    "map message until the client's reply), restore_round_trip_seconds (the restore "
    "message until the swap-in returned), and client_copy_seconds, the client's own "
    "measure of that restore (access granted and every byte copied): the restore round "
    "trip less it is the two messages and the threads' hand-offs.",
]


def paced_notes(pace_bytes_per_second: float) -> list[str]:
    gbps = pace_bytes_per_second / 1e9
    return [
        f"SCALED: the client's sim mapper paced every copy to an emulated {gbps:.2f} GB/s "
        "link (one link shared by both copy streams: each copy books its bytes on one "
        "timeline, its memmove counts towards its slot, then it waits out the rest). The "
        "swap-in and sync-baseline throughputs describe that emulation, not a measured "
        "link; swap-out copies nothing (weights are clean) and is not paced.",
        f"Ceiling (link): model bytes / {gbps:.2f} GB/s, the time the emulated link needs "
        "for every byte (link_seconds); ratio_to_ceiling = link_seconds / swap-in seconds, so "
        "1 - ratio is the engine's own overhead on top of the link.",
        "Machine ceiling (ceiling_copy, unpaced) is measured in the same run as in the "
        "unpaced bench; pace_fraction_of_machine_ceiling is the pace over it and must stay "
        "below 1 (a link faster than this machine copies cannot be emulated here).",
        "Sync baseline: one allocation (engine chunk) at a time, create, export, map "
        "MAP_POPULATE, copy paced to the same link, then the next (how vLLM's sleep-mode "
        "wake-up copies), in one thread.",
        *NOTES[4:],  # each repetition, ratios, what swap_in and swap_out are
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--sizes-mib", default="64,256,1024")
    p.add_argument("--reps", type=int, default=11)
    p.add_argument(
        "--pace-gbps",
        type=float,
        default=0.0,
        help="pace copies to an emulated link of this many GB/s (below this machine's copy "
        "ceiling); written to swap-paced.json as scaled",
    )
    p.add_argument(
        "--no-results", action="store_true", help="print only; write no result file (tests)"
    )
    args = p.parse_args(argv)
    scratch.unwind_on_signals()
    pace = args.pace_gbps * 1e9
    load_start = results_schema.load_average()
    results: list[dict[str, Any]] = []
    profiles: list[str] = []
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    with scratch.directory("modelswap-bench-", "/dev/shm") as tmp:
        print(f"workdir {tmp}", flush=True)
        for mib in sizes:
            # the smallest size's fixed cost is the one to explain: profile it (untimed)
            rows = run_size(mib * MIB, args.reps, Path(tmp), pace)
            results += rows
            r = rows[0]["metrics"]
            print(
                f"{mib:5d} MiB  swap-in {rows[0]['median'] * 1e3:8.1f} ms "
                f"({r['throughput_bytes_per_second'] / 1e9:5.2f} GB/s"
                f"{' SCALED' if pace else ''}, "
                f"{r['ratio_to_ceiling']:.2f}x {'link' if pace else 'ceiling'}, "
                f"{r['ratio_to_sync_baseline']:.2f}x sync)  "
                f"swap-out {rows[1]['median'] * 1e3:7.1f} ms; swap-in's map round trip "
                f"{r['map_round_trip_seconds'] * 1e3:.1f} ms, restore round trip "
                f"{r['restore_round_trip_seconds'] * 1e3:.1f} ms (the client's copy "
                f"{r['client_copy_seconds'] * 1e3:.1f} ms)",
                flush=True,
            )
        if not pace:
            # where the smallest swap-in's fixed cost goes: a separate, profiled run (the
            # profilers slow what they watch, so none of its times is reported as a figure)
            run_size(min(sizes) * MIB, 1, Path(tmp), profile=True, profile_out=profiles)
    notes = list(NOTES)
    if not pace:
        fixed = fixed_cost(results)
        if fixed is not None:
            results.append(fixed)
            m = fixed["metrics"]
            print(
                f"fixed cost per swap-in {m['swap_in_intercept_seconds'] * 1e3:.1f} ms "
                f"(ceiling's {m['ceiling_intercept_seconds'] * 1e3:.1f} ms)",
                flush=True,
            )
        notes += [f"Profile of the {min(sizes)} MiB swap-in (agent side): {p}" for p in profiles]
        for p_text in profiles:
            print(p_text, flush=True)
    if args.no_results:
        return 0
    if pace:
        path = results_schema.write(
            "swap-paced",
            f"make bench-swap (python -m bench.swap --pace-gbps {args.pace_gbps:g})",
            results,
            paced_notes(pace),
            backend="sim",
            scaled=True,
            scaled_target_bytes_per_second=pace,
            load_average_start=load_start,
        )
    else:
        path = results_schema.write(
            "swap",
            "make bench-swap (python -m bench.swap)",
            results,
            notes,
            backend="sim",
            scaled=False,
            load_average_start=load_start,
        )
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
