"""GPU swap benchmark: cuda-vmm swap-in/out against the pinned-copy ceiling and a
one-allocation-at-a-time synchronous baseline, on a real GPU.

    python bench/gpu_swap.py [--sizes-mib 1024,4096] [--repeats 5] [--chunk-mib 256]

Needs only Python, cuda-bindings and nvidia-ml-py (the package need not be installed: the
source folders are put on sys.path). Writes bench/results/<machine-class>/gpu-swap.json in
the `modelswap.bench/v1` schema of bench/results_schema.py, with the GPU in the machine
class. Per model size S (median of `repeats`):

- swap_in: the agent creates S/chunk chunks (cuMemCreate) and exports fds; the client
  imports, maps at its reserved addresses, sets access per chunk and queues each chunk's
  host→device copy (2 streams) as soon as it is mapped, so creating chunk i+1 overlaps
  copying chunk i; timed until every copy finished. The host-store file is mapped and
  pinned (cuMemHostRegister, read-only) beforehand; `host_register` reports that cost
  separately, since the client library pins on every restore.
- swap_out: synchronize, unmap and release on both sides.
- ceiling: one cuMemcpyHtoD of S bytes from the same pinned host buffer into a cuMemAlloc
  buffer (the pinned cudaMemcpy ceiling), measured in the same run.
- sync baseline: the same bytes one allocation at a time, synchronously — create, map,
  set access, cuMemcpyHtoD, then the next (how vLLM's sleep-mode wake-up copies).

ratio_to_ceiling = ceiling seconds / swap-in seconds (goal ≥ 0.9); ratio_to_sync_baseline =
baseline seconds / swap-in seconds (> 1: faster than one-at-a-time).
"""

# ruff: noqa: PLC0415 - the package imports follow the sys.path set-up below, at use
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _sub in ("api", "sidecar", "client", ""):
    _path = str(ROOT / _sub) if _sub else str(ROOT)
    if _path not in sys.path:
        sys.path.insert(0, _path)

MIB = 1 << 20


def _check(result: Any) -> Any:
    if int(result[0]) != 0:
        raise RuntimeError(f"CUDA error {result[0]}")
    rest = result[1:]
    return rest[0] if len(rest) == 1 else (rest or None)


def _model_fd(size: int) -> int:
    block = hashlib.shake_256(b"modelswap-gpu-bench").digest(64 * MIB)
    fd = os.memfd_create("host-store")
    for offset in range(0, size, len(block)):
        os.write(fd, block[: min(len(block), size - offset)])
    ro = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    os.close(fd)
    return ro


def run(
    sizes: list[int], *, repeats: int = 5, chunk_bytes: int = 256 * MIB
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from cuda.bindings import driver as d

    from bench.results_schema import result
    from modelswap_client.mappers.cuda_vmm import CudaVmmMapper
    from modelswap_sidecar.allocators.base import Location
    from modelswap_sidecar.allocators.cuda_vmm import CudaVmmAllocator

    allocator = CudaVmmAllocator(gpus=[0], chunk_bytes=chunk_bytes, max_chunk_bytes=chunk_bytes)
    gpu = allocator.gpus[0]
    mapper = CudaVmmMapper(device=gpu.uuid, chunk_bytes=chunk_bytes, streams=2)
    loc = Location.device(0)
    _err, driver_version = d.cuDriverGetVersion()
    info = {"gpu": gpu.name, "gpu_uuid": gpu.uuid, "cuda_driver": int(driver_version)}
    results: list[dict[str, Any]] = []
    try:
        for size in sizes:
            fd = _model_fd(size)
            t0 = time.perf_counter()
            host = mapper.map_host(fd, size)
            register_s = time.perf_counter() - t0
            region = mapper.reserve(size)
            swap_in, swap_out, ceiling, baseline = [], [], [], []
            try:
                for _ in range(repeats):
                    held = []
                    mapper.synchronize()
                    t0 = time.perf_counter()
                    events = []
                    for n, off in enumerate(range(0, size, chunk_bytes)):
                        chunk = allocator.create(loc, chunk_bytes)
                        handle = mapper.import_fd(allocator.export_fd(chunk), chunk_bytes)
                        mapper.map(region.address + off, chunk_bytes, handle)
                        mapper.set_access(region.address + off, chunk_bytes)
                        held.append((chunk, handle, region.address + off))
                        dst, src = region.address + off, host.address + off
                        events.append(mapper.copy_to_device(dst, src, chunk_bytes, n % 2))
                    for event in events:
                        event.wait()
                    swap_in.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    mapper.synchronize()
                    for chunk, handle, address in held:
                        mapper.unmap(address, chunk_bytes)
                        mapper.release(handle)
                        allocator.release(chunk)
                    swap_out.append(time.perf_counter() - t0)
                dptr = _check(d.cuMemAlloc(size))
                try:
                    for _ in range(repeats):
                        t0 = time.perf_counter()
                        _check(d.cuMemcpyHtoD(dptr, host.address, size))
                        ceiling.append(time.perf_counter() - t0)
                finally:
                    _check(d.cuMemFree(dptr))
                for _ in range(repeats):
                    held = []
                    t0 = time.perf_counter()
                    for off in range(0, size, chunk_bytes):
                        chunk = allocator.create(loc, chunk_bytes)
                        handle = mapper.import_fd(allocator.export_fd(chunk), chunk_bytes)
                        mapper.map(region.address + off, chunk_bytes, handle)
                        mapper.set_access(region.address + off, chunk_bytes)
                        _check(
                            d.cuMemcpyHtoD(region.address + off, host.address + off, chunk_bytes)
                        )
                        held.append((chunk, handle, region.address + off))
                    baseline.append(time.perf_counter() - t0)
                    for chunk, handle, address in held:
                        mapper.unmap(address, chunk_bytes)
                        mapper.release(handle)
                        allocator.release(chunk)
            finally:
                mapper.unmap_host(host)
                os.close(fd)
                mapper.free_reservation(region)
            s_in, s_ceil, s_base = (statistics.median(x) for x in (swap_in, ceiling, baseline))
            params = {"model_bytes": size, "chunk_bytes": chunk_bytes, "streams": 2}
            results += [
                result(
                    "swap_in", params, swap_in,
                    throughput_bytes_per_second=size / s_in,
                    ratio_to_ceiling=s_ceil / s_in,
                    ratio_to_sync_baseline=s_base / s_in,
                ),
                result("swap_out", params, swap_out),
                result("ceiling_pinned_memcpy", params, ceiling,
                       throughput_bytes_per_second=size / s_ceil),
                result("sync_baseline", params, baseline,
                       throughput_bytes_per_second=size / s_base),
                result("host_register", params, [register_s]),
            ]  # fmt: skip
    finally:
        mapper.close()
        allocator.close()
    return results, info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes-mib", default="1024,4096")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-mib", type=int, default=256)
    args = parser.parse_args(argv)
    from bench import results_schema as rs

    sizes = [int(s) * MIB for s in args.sizes_mib.split(",")]
    results, info = run(sizes, repeats=args.repeats, chunk_bytes=args.chunk_mib * MIB)
    m = rs.machine()
    m["gpu"] = info["gpu"]
    m["cuda_driver"] = info["cuda_driver"]
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False, cwd=ROOT
    ).stdout.strip()
    machine_class = rs.machine_class(m)
    doc = {
        "schema": rs.SCHEMA,
        "bench": "gpu-swap",
        "command": "python bench/gpu_swap.py",
        "machine_class": machine_class,
        "machine": m,
        "git_commit": commit,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "backend": "cuda-vmm",
        "scaled": False,
        "notes": [line.strip() for line in (__doc__ or "").split("\n\n")[2:4]],
        "results": results,
    }
    path = rs.RESULTS / machine_class / "gpu-swap.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    for r in results:
        print(
            r["name"], r["params"]["model_bytes"] // MIB, "MiB", f"{r['median']:.4f}s", r["metrics"]
        )
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
