"""`make bench-swap`: swap-in/out latency and throughput of the sim engine, 64 MiB-1 GiB.

For each model size the sim GPU is sized to the model. An in-process engine serves a
separate client process over the real socket; the bench swaps the model out and in
REPS times and takes medians. In the same run it measures:

- the ceiling: a plain copy of the same bytes from the model's host-store file (mapped
  read-only with MAP_POPULATE) into a freshly created, pre-populated memfd chunk of the
  same size, freshly mapped MAP_SHARED|MAP_POPULATE (the map is timed with the copy);
  one thread, one memmove, no protocol;
- the synchronous baseline: the same bytes moved one allocation (engine chunk) at a
  time, each created, mapped and copied before the next starts (how vLLM's wake-up
  copies).

Ratios are time ratios: ceiling seconds / swap-in seconds (1.0 = as fast as the ceiling).
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import results_schema
from modelswap_sidecar.allocators.base import Location
from modelswap_sidecar.allocators.sim import SimAllocator, _new_chunk_fd
from modelswap_sidecar.engine.core import Engine, EngineSettings
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import ModelConfig
from modelswap_sidecar.engine.server import EngineServer
from modelswap_sidecar.engine.vouching import RegisteredVoucher

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
POOL_CHUNK_BYTES = 64 * MIB
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_SHARED, MAP_POPULATE = 0x01, 0x8000
PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE


def _map(fd: int, size: int, prot: int) -> int:
    addr = _libc.mmap(None, size, prot, MAP_SHARED | MAP_POPULATE, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    return int(addr)


def ceiling_seconds(weights: Path, size: int) -> float:
    src_fd = os.open(weights, os.O_RDONLY)
    src = _map(src_fd, size, mmap.PROT_READ)
    dst_fd = _new_chunk_fd(0, size)
    try:
        started = time.perf_counter()
        dst = _map(dst_fd, size, PROT_RW)
        ctypes.memmove(dst, src, size)
        elapsed = time.perf_counter() - started
        _libc.munmap(dst, size)
    finally:
        os.close(dst_fd)
        _libc.munmap(src, size)
        os.close(src_fd)
    return elapsed


def sync_baseline_seconds(weights: Path, size: int, piece: int) -> float:
    src_fd = os.open(weights, os.O_RDONLY)
    src = _map(src_fd, size, mmap.PROT_READ)
    alloc = SimAllocator(capacities_bytes=[size], pool_chunk_bytes=piece)
    alloc.wait_pool_full(60)
    try:
        started = time.perf_counter()
        chunks = []
        for offset in range(0, size, piece):
            n = min(piece, size - offset)
            chunk = alloc.create(Location.device(0), n)
            fd = alloc.export_fd(chunk)
            dst = _map(fd, n, PROT_RW)
            os.close(fd)
            ctypes.memmove(dst, src + offset, n)
            chunks.append((chunk, dst, n))
        elapsed = time.perf_counter() - started
        for chunk, dst, n in chunks:
            _libc.munmap(dst, n)
            alloc.release(chunk)
    finally:
        alloc.close()
        _libc.munmap(src, size)
        os.close(src_fd)
    return elapsed


def run_size(size: int, reps: int, workdir: Path) -> list[dict[str, Any]]:
    allocator = SimAllocator(capacities_bytes=[size], pool_chunk_bytes=POOL_CHUNK_BYTES)
    store = HostStore(workdir / f"store-{size}", {0: size})
    voucher = RegisteredVoucher()
    engine = Engine(allocator, store, voucher, EngineSettings())
    engine.add_model(ModelConfig("bench", 0))
    sock = workdir / f"agent-{size}.sock"
    server = EngineServer(engine, sock)
    server.start()
    client = subprocess.Popen(
        [sys.executable, "-m", "bench.swap_client", str(sock), str(size)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        voucher.register(client.pid, "bench")
        assert client.stdout is not None and client.stdin is not None
        if client.stdout.readline().strip() != "ready":
            raise RuntimeError("bench client did not start")
        outs, ins, ceilings, baselines = [], [], [], []
        weights = next((workdir / f"store-{size}").rglob("*.weights"))
        for _ in range(reps):
            allocator.wait_pool_full(60)
            t = time.perf_counter()
            engine.swap_out("bench")
            outs.append(time.perf_counter() - t)
            allocator.wait_pool_full(60)  # pool refilled, as it would be between swaps
            t = time.perf_counter()
            engine.swap_in("bench")
            ins.append(time.perf_counter() - t)
        engine.swap_out("bench")
        for _ in range(reps):
            ceilings.append(ceiling_seconds(weights, size))
            baselines.append(sync_baseline_seconds(weights, size, POOL_CHUNK_BYTES))
        client.stdin.close()
        verdict = client.stdout.readline().strip()
        if verdict != "ok":
            raise RuntimeError(f"bytes did not survive the swaps: {verdict}")
    finally:
        if client.poll() is None:
            client.kill()
        client.wait()
        server.close()
        engine.close()
        allocator.close()
    med_in, med_out = statistics.median(ins), statistics.median(outs)
    med_ceiling, med_base = statistics.median(ceilings), statistics.median(baselines)
    params = {"model_bytes": size, "pool_chunk_bytes": POOL_CHUNK_BYTES, "reps": reps}
    return [
        results_schema.result(
            "swap_in",
            params,
            ins,
            throughput_bytes_per_second=size / med_in,
            ratio_to_ceiling=med_ceiling / med_in,
            ratio_to_sync_baseline=med_base / med_in,
        ),
        results_schema.result("swap_out", params, outs, throughput_bytes_per_second=size / med_out),
        results_schema.result(
            "ceiling_copy", params, ceilings, throughput_bytes_per_second=size / med_ceiling
        ),
        results_schema.result(
            "sync_one_at_a_time", params, baselines, throughput_bytes_per_second=size / med_base
        ),
    ]


NOTES = [
    "Backend sim: 'HBM' is memfd chunks in host memory; copies are real memmoves, not paced "
    "(scaled: false). Figures describe the engine's overhead on this CPU, not a GPU link.",
    "Ceiling: a plain copy of the model's bytes from its host-store file (mapped read-only, "
    "MAP_POPULATE) into a freshly created pre-populated memfd chunk of the model's size, "
    "freshly mapped MAP_SHARED|MAP_POPULATE (map + one memmove timed), in one thread.",
    "Sync baseline: the same bytes one allocation (engine chunk) at a time: create, map, "
    "copy, then the next, in one thread (how vLLM's sleep-mode wake-up copies).",
    "ratio_to_ceiling and ratio_to_sync_baseline are reference seconds / swap-in seconds "
    "(medians); > 1 means the swap-in was faster than the reference.",
    "swap_in = engine.swap_in(): allocate from the pre-populated pool, export fds over "
    "SCM_RIGHTS, client maps at its reserved addresses, copies from the host store on 2 "
    "copy streams, replies. swap_out = quiesce, unmap, release (weights are clean).",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes-mib", default="64,256,1024")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args(argv)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="modelswap-bench-", dir="/dev/shm") as tmp:
        for mib in (int(s) for s in args.sizes_mib.split(",")):
            rows = run_size(mib * MIB, args.reps, Path(tmp))
            results += rows
            r = rows[0]["metrics"]
            print(
                f"{mib:5d} MiB  swap-in {rows[0]['median'] * 1e3:8.1f} ms "
                f"({r['throughput_bytes_per_second'] / 1e9:5.2f} GB/s, "
                f"{r['ratio_to_ceiling']:.2f}x ceiling, "
                f"{r['ratio_to_sync_baseline']:.2f}x sync)  "
                f"swap-out {rows[1]['median'] * 1e3:7.1f} ms",
                flush=True,
            )
    path = results_schema.write(
        "swap", "make bench-swap", results, NOTES, backend="sim", scaled=False
    )
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
