"""Host↔device link bandwidth, measured once at agent start in a short-lived child process.

The agent itself never creates a CUDA context (its allocator needs none), so the probe runs
as ``python -m modelswap_sidecar.gpu.link_probe --device GPU-… --bytes N``: it allocates a
pinned host buffer and a device buffer of N bytes (256 MiB by default), times `repeats`
`cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` copies with CUDA events after one warm-up each,
prints one JSON line with the median GB/s, frees everything and exits — taking its
context with it. The parent classifies the link:

- ``c2c`` when the GPU walks the CPU's page tables (ATS: Grace NVLink-C2C) or the measured
  host→device rate is beyond any PCIe link (≥ 150 GB/s);
- ``pcie`` otherwise.

The figures go to SwapNode status and metrics; the policy uses them to price swap-ins.
Standard library + `cuda.bindings` only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from modelswap_client import cuda_compat as cc

MIB = 1 << 20
DEFAULT_BYTES = 256 * MIB
C2C_MIN_GBPS = 150.0
EXIT_NO_CUDA = 3


@dataclass(frozen=True, slots=True)
class LinkProbe:
    uuid: str
    kind: str  # "pcie" | "c2c"
    h2d_gbps: float
    d2h_gbps: float
    size_bytes: int
    repeats: int


class LinkProbeError(RuntimeError):
    pass


def classify(h2d_gbps: float, *, host_page_tables: bool) -> str:
    return "c2c" if host_page_tables or h2d_gbps >= C2C_MIN_GBPS else "pcie"


def measure(b: cc.Bindings, device: int | str, size_bytes: int, repeats: int) -> dict[str, Any]:
    """The child's work (also callable in-process against a fake). Raises `CudaError`."""
    from modelswap_client.mappers.cuda_vmm import resolve_device  # noqa: PLC0415 - child only

    d = b.driver
    ordinal = resolve_device(b, device)
    dev = cc.check(b, "cuDeviceGet", d.cuDeviceGet(ordinal))
    uuid = cc.device_uuid(b, dev)
    attr = getattr(
        d.CUdevice_attribute,
        "CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES",
        None,
    )
    host_page_tables = False
    if attr is not None:
        result = d.cuDeviceGetAttribute(attr, dev)
        host_page_tables = cc.code_of(result) == cc.CUDA_SUCCESS and int(result[1]) != 0
    ctx = cc.check(b, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(dev))
    undo: list[tuple[str, Any]] = [
        ("cuDevicePrimaryCtxRelease", lambda: d.cuDevicePrimaryCtxRelease(dev))
    ]
    try:
        cc.check(b, "cuCtxSetCurrent", d.cuCtxSetCurrent(ctx))
        host = cc.check(b, "cuMemAllocHost", d.cuMemAllocHost(size_bytes))
        undo.append(("cuMemFreeHost", lambda: d.cuMemFreeHost(host)))
        dptr = cc.check(b, "cuMemAlloc", d.cuMemAlloc(size_bytes))
        undo.append(("cuMemFree", lambda: d.cuMemFree(dptr)))
        stream = cc.check(
            b, "cuStreamCreate", d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)
        )
        undo.append(("cuStreamDestroy", lambda: d.cuStreamDestroy(stream)))
        start = cc.check(b, "cuEventCreate", d.cuEventCreate(d.CUevent_flags.CU_EVENT_DEFAULT))
        undo.append(("cuEventDestroy", lambda: d.cuEventDestroy(start)))
        end = cc.check(b, "cuEventCreate", d.cuEventCreate(d.CUevent_flags.CU_EVENT_DEFAULT))
        undo.append(("cuEventDestroy", lambda: d.cuEventDestroy(end)))

        def rate(call: str, dst: Any, src: Any) -> float:
            samples = []
            for i in range(repeats + 1):  # the first is a warm-up
                cc.check(b, "cuEventRecord", d.cuEventRecord(start, stream))
                cc.check(b, call, getattr(d, call)(dst, src, size_bytes, stream))
                cc.check(b, "cuEventRecord", d.cuEventRecord(end, stream))
                cc.check(b, "cuEventSynchronize", d.cuEventSynchronize(end))
                ms = float(cc.check(b, "cuEventElapsedTime", d.cuEventElapsedTime(start, end)))
                if i and ms > 0:
                    samples.append(size_bytes / (ms / 1000.0) / 1e9)
            if not samples:
                raise cc.CudaError(call, -1, "no timed sample")
            return float(statistics.median(samples))

        h2d = rate("cuMemcpyHtoDAsync", dptr, host)
        d2h = rate("cuMemcpyDtoHAsync", host, dptr)
    finally:
        for _name, fn in reversed(undo):
            fn()  # best effort: the process exits right after
    return {
        "uuid": uuid,
        "h2d_gbps": round(h2d, 2),
        "d2h_gbps": round(d2h, 2),
        "host_page_tables": host_page_tables,
        "size_bytes": size_bytes,
        "repeats": repeats,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="measure host<->GPU copy bandwidth (pinned)")
    parser.add_argument("--device", required=True, help="GPU UUID or CUDA ordinal")
    parser.add_argument("--bytes", type=int, default=DEFAULT_BYTES)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device: int | str = int(args.device) if args.device.isdigit() else args.device
    try:
        b = cc.load()
        cc.initialize(b)
        result = measure(b, device, args.bytes, args.repeats)
    except cc.CudaUnavailable as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return EXIT_NO_CUDA
    except cc.CudaError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


def probe_link(
    device: str | int,
    *,
    size_bytes: int = DEFAULT_BYTES,
    repeats: int = 5,
    timeout_seconds: float = 60.0,
    command: Sequence[str] | None = None,
) -> LinkProbe:
    """Run the probe child (own process group, killed as a group on timeout)."""
    argv = list(command or [sys.executable, "-m", "modelswap_sidecar.gpu.link_probe"])
    argv += ["--device", str(device), "--bytes", str(size_bytes), "--repeats", str(repeats)]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise LinkProbeError(
            f"link probe for {device} timed out after {timeout_seconds}s"
        ) from None
    lines = [line for line in out.splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        result = {}
    if proc.returncode != 0 or "h2d_gbps" not in result:
        reason = result.get("error") or err.strip()[-500:] or f"exit status {proc.returncode}"
        raise LinkProbeError(f"link probe for {device} failed: {reason}")
    return LinkProbe(
        uuid=str(result["uuid"]),
        kind=classify(float(result["h2d_gbps"]), host_page_tables=bool(result["host_page_tables"])),
        h2d_gbps=float(result["h2d_gbps"]),
        d2h_gbps=float(result["d2h_gbps"]),
        size_bytes=int(result["size_bytes"]),
        repeats=int(result["repeats"]),
    )


def as_status(probe: LinkProbe) -> dict[str, Any]:
    """The SwapNode status fields for one GPU's link."""
    return {"kind": probe.kind, "h2dGBps": probe.h2d_gbps, "d2hGBps": probe.d2h_gbps} | {
        "probeBytes": asdict(probe)["size_bytes"]
    }


if __name__ == "__main__":
    sys.exit(main())
