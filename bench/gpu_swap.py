"""GPU swap benchmark: cuda-vmm swap-in/out against the pinned-copy ceiling and a
one-allocation-at-a-time synchronous baseline, on a real GPU.

    python bench/gpu_swap.py [--sizes-mib 1024,4096,16384] [--repeats 5] [--chunk-mib 256]

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
- ceiling: the faster of two ways to copy S bytes from the same pinned host buffer with
  no allocation or mapping in the timed part, measured in the same run: one cuMemcpyHtoD
  into a cuMemAlloc buffer (the pinned cudaMemcpy ceiling), and the swap-in's own chunked
  copies on 2 streams into memory already mapped (`ceiling_copy_only`).
- NVML: free HBM before a swap-in, while resident and after the swap-out
  (`hbm_freed_bytes` on swap_out: what the swap-out gave back).
- managed: the `managed` mapper's prefetch of a region of the first size to the CPU and
  back (cudaMemPrefetchAsync), where the GPU supports managed memory.
- sync baseline: the same bytes one allocation at a time, synchronously — create, map,
  set access, cuMemcpyHtoD, then the next (how vLLM's sleep-mode wake-up copies).

ratio_to_ceiling = ceiling seconds / swap-in seconds (goal ≥ 0.9; above 1 would mean the
ceiling is wrong); ratio_to_sync_baseline = baseline seconds / swap-in seconds (> 1:
faster than one-at-a-time).
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
    from modelswap_sidecar.gpu.nvml import NvmlMemory

    nvml = NvmlMemory.open()
    allocator = CudaVmmAllocator(
        gpus=[0], nvml=nvml, chunk_bytes=chunk_bytes, max_chunk_bytes=chunk_bytes
    )
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
            swap_in, swap_out, ceiling, baseline, copy_only = [], [], [], [], []
            free: dict[str, int] = {}

            def free_bytes() -> int:
                return nvml.memory(gpu.uuid).free_bytes if nvml is not None else -1

            try:
                for _ in range(repeats):
                    held = []
                    mapper.synchronize()
                    free["before_swap_in"] = free_bytes()
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
                    free["resident"] = free_bytes()
                    t0 = time.perf_counter()
                    events = [
                        mapper.copy_to_device(
                            region.address + off, host.address + off, chunk_bytes, n % 2
                        )
                        for n, off in enumerate(range(0, size, chunk_bytes))
                    ]
                    for event in events:
                        event.wait()
                    copy_only.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    mapper.synchronize()
                    for chunk, handle, address in held:
                        mapper.unmap(address, chunk_bytes)
                        mapper.release(handle)
                        allocator.release(chunk)
                    swap_out.append(time.perf_counter() - t0)
                    free["after_swap_out"] = free_bytes()
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
            s_in, s_memcpy, s_copy, s_base = (
                statistics.median(x) for x in (swap_in, ceiling, copy_only, baseline)
            )
            s_ceil = min(s_memcpy, s_copy)  # the fastest way tried to do the same copy
            hbm = (  # NVML's view of the last cycle (none without NVML)
                {
                    "hbm_freed_bytes": free["after_swap_out"] - free["resident"],
                    "hbm_taken_by_swap_in_bytes": free["before_swap_in"] - free["resident"],
                }
                if nvml is not None
                else {}
            )
            params = {"model_bytes": size, "chunk_bytes": chunk_bytes, "streams": 2}
            results += [
                result(
                    "swap_in", params, swap_in,
                    throughput_bytes_per_second=size / s_in,
                    ratio_to_ceiling=s_ceil / s_in,
                    ratio_to_sync_baseline=s_base / s_in,
                ),
                result("swap_out", params, swap_out, **hbm),
                result("ceiling_pinned_memcpy", params, ceiling,
                       throughput_bytes_per_second=size / s_memcpy),
                result("ceiling_copy_only", params, copy_only,
                       throughput_bytes_per_second=size / s_copy),
                result("sync_baseline", params, baseline,
                       throughput_bytes_per_second=size / s_base),
                result("host_register", params, [register_s]),
            ]  # fmt: skip
        results += _managed_round_trip(sizes[0], repeats)
    finally:
        mapper.close()
        allocator.close()
        if nvml is not None:
            nvml.close()
    return results, info


def _managed_round_trip(size: int, repeats: int) -> list[dict[str, Any]]:
    """The managed mapper's prefetch of `size` bytes to the CPU and back (no result where
    the GPU or driver has no managed memory)."""
    from bench.results_schema import result
    from modelswap_client.mappers.base import MapperError
    from modelswap_client.mappers.managed import ManagedMapper

    try:
        mapper = ManagedMapper(device=0)
    except MapperError as e:
        print(f"managed mapper unavailable: {e}")
        return []
    region = mapper.reserve(size)
    to_host, to_device = [], []
    try:
        mapper.prefetch_to_device(region).wait()
        for _ in range(repeats):
            t0 = time.perf_counter()
            mapper.prefetch_to_host(region).wait()
            to_host.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            mapper.prefetch_to_device(region).wait()
            to_device.append(time.perf_counter() - t0)
    finally:
        mapper.free_reservation(region)
        mapper.close()
    params = {"model_bytes": size, "backend": "managed"}
    return [
        result("managed_prefetch_to_host", params, to_host,
               throughput_bytes_per_second=size / statistics.median(to_host)),
        result("managed_prefetch_to_device", params, to_device,
               throughput_bytes_per_second=size / statistics.median(to_device)),
    ]  # fmt: skip


def _notes() -> list[str]:
    """The docstring's list of what is measured, one note per item, and its ratio line."""
    parts = (__doc__ or "").split("\n\n")
    items = [" ".join(i.split()) for i in ("\n" + parts[3]).split("\n- ") if i.strip()]
    return [*items, " ".join(parts[4].split())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes-mib", default="1024,4096,16384")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-mib", type=int, default=256)
    args = parser.parse_args(argv)
    from bench import results_schema as rs

    sizes = [int(s) * MIB for s in args.sizes_mib.split(",")]
    results, info = run(sizes, repeats=args.repeats, chunk_bytes=args.chunk_mib * MIB)
    m = rs.machine()
    m["gpu"] = info["gpu"]
    m["cuda_driver"] = info["cuda_driver"]
    # a GPU machine gets a copy of the working tree whose .git may be another commit's:
    # the caller says which commit it sent (tests/gpu/run_on_device.sh)
    commit = (
        os.environ.get("MODELSWAP_BENCH_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False, cwd=ROOT
        ).stdout.strip()
    )
    machine_class = rs.machine_class(m)
    doc = {
        "schema": rs.SCHEMA,
        "bench": "gpu-swap",
        "command": " ".join(["python bench/gpu_swap.py", *(argv or sys.argv[1:])]),
        "machine_class": machine_class,
        "machine": m,
        "git_commit": commit,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "backend": "cuda-vmm",
        "scaled": False,
        "notes": _notes(),
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
