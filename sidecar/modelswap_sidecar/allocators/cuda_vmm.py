"""The `cuda-vmm` allocator: physical HBM chunks created by the agent, exported as fds.

The agent never creates a CUDA context for this: `cuMemCreate` (pinned, device location,
`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`), `cuMemExportToShareableHandle`,
`cuMemImportFromShareableHandle` (readopt) and `cuMemRelease` need only `cuInit`. Memory
info comes from NVML (no context either). GPUs are keyed by UUID; `Location.device(n)`
uses the agent's ordinal under `CUDA_DEVICE_ORDER=PCI_BUS_ID`.

Out of memory is normal operation, never a crash: `create` retries a few times with a
short backoff (memory another process released may take a moment to come back) and then
raises `OutOfDeviceMemory` with NVML's free figure, so the engine swaps out victims,
waits or refuses with a reason.

With `host_numa_cache=True`, `Location.host(n)` creates `CU_MEM_LOCATION_TYPE_HOST_NUMA`
chunks on the GPUs' NUMA nodes: pinned host memory the GPU reads at full link speed, but
they die with their last handle, so they are only ever a cache in front of the host-store
files, never the store.

Standard library + `cuda.bindings` + `pynvml` only.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from modelswap_client import cuda_compat as cc
from modelswap_sidecar.allocators.base import (
    GIB,
    GRANULARITY_BYTES,
    MIB,
    Allocator,
    AllocatorError,
    Chunk,
    ChunkId,
    Location,
    LocationKind,
    MemoryInfo,
    OutOfDeviceMemory,
)
from modelswap_sidecar.gpu import devices as gpu_devices
from modelswap_sidecar.gpu.nvml import NvmlError, NvmlMemory, overhead_bytes

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 256 * MIB
DEFAULT_MAX_CHUNK_BYTES = 1 * GIB


@dataclass(slots=True)
class _Live:
    chunk: Chunk
    handle: Any


def _numa_meminfo(node: int) -> tuple[int, int]:
    """(total, free) bytes of host NUMA node `node` (the whole host when unknown)."""
    path = f"/sys/devices/system/node/node{node}/meminfo" if node >= 0 else "/proc/meminfo"
    fields: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.replace(":", " ").split()
                if "MemTotal" in parts or "MemFree" in parts:
                    key = "MemTotal" if "MemTotal" in parts else "MemFree"
                    fields[key] = int(parts[parts.index(key) + 1]) * 1024
    except OSError:
        return 0, 0
    return fields.get("MemTotal", 0), fields.get("MemFree", 0)


class CudaVmmAllocator(Allocator):
    """See the module doc.

    Options: `gpus` (UUIDs or ordinals to manage; default all capable ones),
    `chunk_bytes` (preferred chunk, default 256 MiB), `max_chunk_bytes` (default 1 GiB),
    `host_numa_cache`, `oom_retries` / `oom_backoff_seconds`, and for tests `bindings`,
    `nvml` (an `NvmlMemory`, None to skip NVML) and `sleep`.
    """

    name = "cuda-vmm"

    def __init__(
        self,
        *,
        gpus: Sequence[str | int] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
        host_numa_cache: bool = False,
        oom_retries: int = 2,
        oom_backoff_seconds: float = 0.005,
        bindings: cc.Bindings | None = None,
        nvml: NvmlMemory | str | None = "auto",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        for value, what in ((chunk_bytes, "chunk_bytes"), (max_chunk_bytes, "max_chunk_bytes")):
            if value <= 0 or value % GRANULARITY_BYTES:
                raise AllocatorError(f"{what} {value} is not a positive multiple of 2 MiB")
        if chunk_bytes > max_chunk_bytes:
            raise AllocatorError("chunk_bytes exceeds max_chunk_bytes")
        gpu_devices.ensure_pci_bus_order()
        try:
            self._b = bindings or cc.load()
            cc.initialize(self._b)
        except cc.CudaUnavailable as e:
            log.error("cuda-vmm allocator not available, no CUDA backend selected: %s", e)
            raise AllocatorError(f"cuda-vmm allocator unavailable: {e}") from e
        try:
            visible = gpu_devices.probe_devices(self._b)
        except cc.CudaError as e:
            raise AllocatorError(f"probing GPUs failed: {e}") from e
        capable = []
        for gpu in visible:
            if gpu.capabilities.cuda_vmm_ok and self._granularity_ok(gpu):
                capable.append(gpu)
            elif gpu.capabilities.cuda_vmm_ok:
                log.warning(
                    "GPU %d (%s): VMM granularity does not divide 2 MiB; not managed",
                    gpu.ordinal,
                    gpu.uuid,
                )
            else:
                log.warning(
                    "GPU %d (%s) lacks VMM or POSIX-fd handles (%s); not managed",
                    gpu.ordinal,
                    gpu.uuid,
                    gpu.capabilities,
                )
        try:
            self.gpus = gpu_devices.select(capable, list(gpus) if gpus is not None else None)
        except ValueError as e:
            raise AllocatorError(str(e)) from e
        if not self.gpus:
            log.error(
                "cuda-vmm: no GPU with VMM and POSIX-fd handles among %d visible", len(visible)
            )
            raise AllocatorError("no GPU supports cuda-vmm (VMM + POSIX fd handles)")
        self._by_ordinal = {g.ordinal: g for g in self.gpus}
        self._chunk_bytes = chunk_bytes
        self._max_chunk_bytes = max_chunk_bytes
        self._numa_nodes = (
            sorted(
                {g.capabilities.host_numa_id for g in self.gpus if g.capabilities.host_numa_id >= 0}
            )
            if host_numa_cache
            else []
        )
        self._oom_retries = max(0, oom_retries)
        self._oom_backoff = oom_backoff_seconds
        self._sleep = sleep
        self._nvml: NvmlMemory | None
        if isinstance(nvml, str):
            if nvml != "auto":
                raise AllocatorError(f"nvml option {nvml!r}: pass 'auto', an NvmlMemory or None")
            self._nvml = NvmlMemory.open()
        else:
            self._nvml = nvml
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._live: dict[ChunkId, _Live] = {}
        self._closed = False
        for g in self.gpus:
            log.info(
                "cuda-vmm: GPU %d %s %s (%s), %d MiB, %d copy engines, host NUMA %d",
                g.ordinal,
                g.uuid,
                g.name,
                g.pci_bus_id,
                g.total_bytes // MIB,
                g.capabilities.copy_engines,
                g.capabilities.host_numa_id,
            )

    def _granularity_ok(self, gpu: gpu_devices.GpuInfo) -> bool:
        d = self._b.driver
        result = d.cuMemGetAllocationGranularity(
            cc.allocation_prop(self._b, ordinal=gpu.ordinal),
            d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
        if cc.code_of(result) != cc.CUDA_SUCCESS:
            log.warning(
                "GPU %d: cuMemGetAllocationGranularity failed: %s",
                gpu.ordinal,
                cc.error_name(self._b, result[0]),
            )
            return False
        granularity = int(result[1])
        return granularity > 0 and GRANULARITY_BYTES % granularity == 0

    # --- locations ------------------------------------------------------------------------

    def locations(self) -> list[Location]:
        found = [Location.device(g.ordinal) for g in self.gpus]
        return found + [Location.host(n) for n in self._numa_nodes]

    def _check_location(self, location: Location) -> None:
        if location.kind is LocationKind.DEVICE and location.index in self._by_ordinal:
            return
        if location.kind is LocationKind.HOST and location.index in self._numa_nodes:
            return
        raise AllocatorError(f"location {location} is not managed by this allocator")

    def gpu(self, location: Location) -> gpu_devices.GpuInfo:
        """The GPU behind a device location (UUID, capabilities)."""
        if location.kind is not LocationKind.DEVICE or location.index not in self._by_ordinal:
            raise AllocatorError(f"{location} is not a managed GPU")
        return self._by_ordinal[location.index]

    def granularity_bytes(self, location: Location) -> int:
        self._check_location(location)
        return GRANULARITY_BYTES

    def preferred_chunk_bytes(self, location: Location) -> int:
        self._check_location(location)
        return self._chunk_bytes

    def max_chunk_bytes(self, location: Location) -> int:
        self._check_location(location)
        return self._max_chunk_bytes

    def _prop(self, location: Location) -> Any:
        if location.kind is LocationKind.DEVICE:
            return cc.allocation_prop(self._b, ordinal=location.index)
        return cc.allocation_prop(self._b, numa_node=location.index)

    # --- chunks ---------------------------------------------------------------------------

    def create(self, location: Location, size_bytes: int) -> Chunk:
        self._check_location(location)
        if size_bytes <= 0 or size_bytes % GRANULARITY_BYTES:
            raise AllocatorError(f"size {size_bytes} is not a positive multiple of 2 MiB")
        if size_bytes > self._max_chunk_bytes:
            raise AllocatorError(
                f"size {size_bytes} exceeds the {self._max_chunk_bytes}-byte chunk limit"
            )
        self._ensure_open()
        prop = self._prop(location)
        attempt = 0
        while True:
            result = self._b.driver.cuMemCreate(size_bytes, prop, 0)
            code = cc.code_of(result)
            if code == cc.CUDA_SUCCESS:
                break
            if code != cc.CUDA_ERROR_OUT_OF_MEMORY:
                raise AllocatorError(
                    f"cuMemCreate({size_bytes}) at {location}: {cc.error_name(self._b, result[0])}"
                )
            if attempt >= self._oom_retries:
                free = self.memory_info(location).free_bytes
                log.warning(
                    "cuda-vmm: out of memory at %s: %d MiB requested, %d MiB free (after %d tries)",
                    location,
                    size_bytes // MIB,
                    free // MIB,
                    attempt + 1,
                )
                raise OutOfDeviceMemory(
                    f"out of memory at {location}: {size_bytes} bytes requested, {free} free",
                    requested_bytes=size_bytes,
                    free_bytes=free,
                )
            self._sleep(self._oom_backoff * (2**attempt))
            attempt += 1
        chunk = Chunk(ChunkId(next(self._ids)), location, size_bytes)
        with self._lock:
            self._live[chunk.chunk_id] = _Live(chunk, result[1])
        log.debug("created chunk %d: %d MiB at %s", chunk.chunk_id, size_bytes // MIB, location)
        return chunk

    def _live_entry(self, chunk: Chunk) -> _Live:
        with self._lock:
            live = self._live.get(chunk.chunk_id)
        if live is None or live.chunk != chunk:
            raise AllocatorError(f"chunk {chunk.chunk_id} is not live")
        return live

    def export_fd(self, chunk: Chunk) -> int:
        live = self._live_entry(chunk)
        result = self._b.driver.cuMemExportToShareableHandle(
            live.handle, cc.posix_fd_handle_type(self._b), 0
        )
        try:
            fd = int(cc.check(self._b, "cuMemExportToShareableHandle", result))
        except cc.CudaError as e:
            raise AllocatorError(f"export of chunk {chunk.chunk_id}: {e}") from e
        return fd

    def release(self, chunk: Chunk) -> None:
        with self._lock:
            live = self._live.get(chunk.chunk_id)
            if live is None:
                return  # idempotent
            result = self._b.driver.cuMemRelease(live.handle)
            if cc.code_of(result) != cc.CUDA_SUCCESS:
                raise AllocatorError(
                    f"cuMemRelease of chunk {chunk.chunk_id}: {cc.error_name(self._b, result[0])}"
                )
            del self._live[chunk.chunk_id]

    def adopt_fd(self, location: Location, fd: int, size_bytes: int) -> Chunk:
        self._check_location(location)
        if size_bytes <= 0 or size_bytes % GRANULARITY_BYTES:
            raise AllocatorError(f"size {size_bytes} is not a positive multiple of 2 MiB")
        self._ensure_open()
        d = self._b.driver
        result = d.cuMemImportFromShareableHandle(fd, cc.posix_fd_handle_type(self._b))
        try:
            handle = cc.check(self._b, "cuMemImportFromShareableHandle", result)
        except cc.CudaError as e:
            raise AllocatorError(f"readopt at {location}: {e}") from e
        try:
            prop = cc.check(
                self._b,
                "cuMemGetAllocationPropertiesFromHandle",
                d.cuMemGetAllocationPropertiesFromHandle(handle),
            )
            kinds = d.CUmemLocationType
            want = (
                kinds.CU_MEM_LOCATION_TYPE_DEVICE
                if location.kind is LocationKind.DEVICE
                else kinds.CU_MEM_LOCATION_TYPE_HOST_NUMA
            )
            if prop.location.type != want or int(prop.location.id) != location.index:
                raise AllocatorError(
                    f"readopted chunk lives at {prop.location.type}:{prop.location.id}, "
                    f"not {location}"
                )
        except (cc.CudaError, AllocatorError) as e:
            d.cuMemRelease(handle)
            if isinstance(e, AllocatorError):
                raise
            raise AllocatorError(f"readopt at {location}: {e}") from e
        chunk = Chunk(ChunkId(next(self._ids)), location, size_bytes)
        with self._lock:
            self._live[chunk.chunk_id] = _Live(chunk, handle)
        return chunk

    def _ensure_open(self) -> None:
        if self._closed:
            raise AllocatorError("allocator is closed")

    # --- accounting -----------------------------------------------------------------------

    def used_bytes(self, location: Location) -> int:
        with self._lock:
            return sum(
                v.chunk.size_bytes for v in self._live.values() if v.chunk.location == location
            )

    def memory_info(self, location: Location) -> MemoryInfo:
        self._check_location(location)
        used = self.used_bytes(location)
        if location.kind is LocationKind.HOST:
            total, free = _numa_meminfo(location.index)
            return MemoryInfo(location, total, used, free)
        gpu = self._by_ordinal[location.index]
        if self._nvml is not None:
            try:
                info = self._nvml.memory(gpu.uuid)
                return MemoryInfo(location, info.total_bytes, used, info.free_bytes)
            except NvmlError as e:
                log.warning("NVML memory info for %s failed (%s); using CUDA totals", gpu.uuid, e)
        # without NVML: the device total and our own accounting (other processes unseen)
        return MemoryInfo(location, gpu.total_bytes, used, max(0, gpu.total_bytes - used))

    def process_overhead_bytes(
        self,
        location: Location,
        pids: Iterable[int],
        mapped_bytes_by_pid: dict[int, int] | None = None,
    ) -> dict[int, int | None]:
        """Per-process GPU overhead (NVML usage minus mapped chunks) of runtime processes.

        None for a pid whose usage NVML cannot report (and for all pids without NVML).
        """
        gpu = self.gpu(location)
        pid_list = list(pids)
        if self._nvml is None:
            return dict.fromkeys(pid_list)
        try:
            used = self._nvml.process_used_bytes(gpu.uuid)
        except NvmlError as e:
            log.warning("NVML per-process usage for %s failed: %s", gpu.uuid, e)
            return dict.fromkeys(pid_list)
        return overhead_bytes(used, pid_list, mapped_bytes_by_pid)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = list(self._live.values())
            self._live.clear()
        for entry in live:
            result = self._b.driver.cuMemRelease(entry.handle)
            if cc.code_of(result) != cc.CUDA_SUCCESS:
                log.warning("cuMemRelease at close: %s", cc.error_name(self._b, result[0]))
        if self._nvml is not None:
            self._nvml.close()
