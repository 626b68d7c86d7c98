# ruff: noqa: N812, N818 - mirrors the cuda.bindings names
"""A call-recording fake of the CUDA driver and runtime, with CUDA's rules enforced.

`FakeCuda` is one "machine": GPUs with memory limits, VMM allocations exported as real
memfds (so they travel over `SCM_RIGHTS` like the driver's fds), virtual reservations,
mappings with access flags, streams whose copies run only at a synchronization point
(so a missing synchronize shows up as a rule violation, not as luck), events, registered
host ranges, managed allocations with residency. Device bytes are real (`bytearray` per
allocation), so round trips through the fake are byte-exact or fail.

Every API call is recorded in `calls` (name, args) before it runs. `fail(name, nth=...)`
makes the nth later call of `name` return an error with no side effect, the way a driver
error does. Rule breaks (unmap with a copy in flight, copy into a range without access,
release of a mapped handle…) are appended to `violations`; tests assert it stays empty.

`modules.install()` exposes the API as `cuda.bindings.driver` / `.runtime` modules in the
signatures of cuda-bindings 12.x or 13.x.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.fake_cuda import types as T

MIB = 1 << 20
GRANULARITY = 2 * MIB
VA_BASE = 1 << 52  # far above any user-space host address: fake device VAs never alias host memory
R = T.CUresult


@dataclass
class Call:
    name: str
    args: tuple[Any, ...]


@dataclass
class FakeDevice:
    uuid: bytes
    total_bytes: int
    pci_bus_id: str = "0000:01:00.0"
    name: str = "Fake H100"
    attributes: dict[str, int] = field(default_factory=dict)


def default_attributes(numa_node: int = 0) -> dict[str, int]:
    a = T.CUdevice_attribute
    return {
        a.CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT.name: 3,
        a.CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS.name: 1,
        a.CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES.name: 0,
        a.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED.name: 1,
        a.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED.name: 1,
        a.CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED.name: 1,
        a.CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED.name: 1,
        a.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID.name: numa_node,
    }


@dataclass
class Allocation:
    alloc_id: int
    size: int
    kind: str  # "device" | "host_numa" | "classic" (cuMemAlloc) | "managed"
    where: int  # device ordinal or NUMA node
    handles: int = 0
    data: bytearray | None = None
    freed: bool = False

    def buffer(self) -> bytearray:
        if self.data is None:
            self.data = bytearray(self.size)
        return self.data


@dataclass
class Mapping:
    address: int
    size: int
    alloc: Allocation
    offset: int
    access: int = 0  # CUmemAccess_flags value; 0 = none
    imported: bool = False  # mapped through a handle this process imported


@dataclass
class Op:
    stream: int
    kind: str  # "copy" | "record" | "prefetch"
    run: Callable[[], int]  # returns a CUresult value
    nbytes: int = 0
    event: int = 0
    ranges: tuple[tuple[int, int], ...] = ()  # (address, size) the op touches


class Unsupported(Exception):
    pass


def _host_perms(address: int, size: int) -> str | None:
    """'rw'/'r-'/... if [address, address+size) lies in mapped host memory, else None."""
    end = address + size
    covered = address
    perms = "rw"
    with open("/proc/self/maps") as f:
        ranges = []
        for line in f:
            span, p = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            ranges.append((lo, hi, p))
    for lo, hi, p in sorted(ranges):
        if hi <= covered or lo > covered:
            continue
        if "r" not in p:
            return None
        if "w" not in p:
            perms = "r-"
        covered = hi
        if covered >= end:
            return perms
    return None


class FakeCuda:
    """The fake machine; see the module doc."""

    def __init__(self, *, major: int = 13, gpus: int = 1, total_bytes: int = 64 * MIB) -> None:
        self.major = major
        self.devices = [
            FakeDevice(
                uuid=bytes([0xA0 + i]) + bytes(range(1, 16)),
                total_bytes=total_bytes,
                pci_bus_id=f"0000:{0x17 + i:02x}:00.0",
                attributes=default_attributes(numa_node=i),
            )
            for i in range(gpus)
        ]
        self.calls: list[Call] = []
        self.violations: list[str] = []
        self.initialized = False
        self.no_driver = False  # cuInit raises, as the bindings do without libcuda.so.1
        self.init_error: int | None = None  # cuInit returns this code
        self._failures: dict[str, list[tuple[int, int]]] = {}  # name -> [(countdown, code)]
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._tls = threading.local()
        self.allocations: dict[int, Allocation] = {}
        self.handles: dict[int, Allocation] = {}  # live handle value -> allocation
        #: handles that came from cuMemImportFromShareableHandle (or were retained from a
        #: mapping of one): the real driver refuses to export them again
        self.imported_handles: set[int] = set()
        self.exports: dict[int, Allocation] = {}  # memfd inode -> allocation
        self.reservations: dict[int, int] = {}  # address -> size
        self.mappings: dict[int, Mapping] = {}  # address -> mapping
        self.contexts: dict[int, int] = {}  # device ordinal -> primary ctx refcount
        self.streams: set[int] = set()
        self.events: dict[int, dict[str, Any]] = {}
        self.pending: list[Op] = []
        self.registered: dict[int, tuple[int, int]] = {}  # host address -> (size, flags)
        self.host_buffers: dict[int, ctypes.Array[ctypes.c_char]] = {}  # cuMemAllocHost
        self.managed: dict[int, tuple[Allocation, ctypes.Array[ctypes.c_char]]] = {}
        self.managed_resident: dict[int, int | None] = {}  # address -> device ordinal or None
        self.clock_s = 0.0
        self.bandwidth_bytes_per_s = 50e9
        self.not_ready_polls = 0  # cuEventQuery answers NOT_READY this many times first
        self._va_next = VA_BASE
        self.unpinned_copies = 0

    # --- test controls ------------------------------------------------------------------

    def fail(self, name: str, *, nth: int = 1, code: int = R.CUDA_ERROR_UNKNOWN) -> None:
        """Make the `nth` later call of `name` return `code` without side effects."""
        self._failures.setdefault(name, []).append((nth, int(code)))

    def names(self) -> list[str]:
        return [c.name for c in self.calls]

    def calls_named(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name]

    def used_bytes(self, ordinal: int) -> int:
        """Device memory held: live VMM/classic allocations plus device-resident managed."""
        total = 0
        for a in self.allocations.values():
            if a.freed or a.where != ordinal:
                continue
            if a.kind in ("device", "classic") or (
                a.kind == "managed" and self.managed_resident.get(a.alloc_id) == ordinal
            ):
                total += a.size
        return total

    def free_bytes(self, ordinal: int) -> int:
        return self.devices[ordinal].total_bytes - self.used_bytes(ordinal)

    def live_allocations(self) -> list[Allocation]:
        self.collect()
        return [a for a in self.allocations.values() if not a.freed and a.kind != "managed"]

    def open_export_fds(self, alloc: Allocation) -> list[int]:
        """Fds open in this process that refer to `alloc` (memfds named after it)."""
        found = []
        tag = f"/memfd:fake-cuda-{alloc.alloc_id}"
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            if target in (tag, f"{tag} (deleted)"):
                found.append(int(name))
        return found

    def collect(self) -> None:
        """Free allocations with no handle, no mapping and no open exported fd (the driver's
        refcount: an open exported fd pins the physical memory)."""
        with self._lock:
            mapped = {id(m.alloc) for m in self.mappings.values()}
            for a in self.allocations.values():
                if a.freed or a.kind in ("classic", "managed"):
                    continue
                if a.handles == 0 and id(a) not in mapped and not self.open_export_fds(a):
                    a.freed = True
                    a.data = None

    # --- plumbing -----------------------------------------------------------------------

    def record(self, name: str, args: tuple[Any, ...]) -> int | None:
        """Log a call; return an injected error code if this call is set to fail."""
        with self._lock:
            self.calls.append(Call(name, args))
            plan = self._failures.get(name)
            if not plan:
                return None
            countdown, code = plan[0]
            if countdown > 1:
                plan[0] = (countdown - 1, code)
                return None
            plan.pop(0)
            return code

    def need_init(self) -> None:
        if not self.initialized:
            raise _Err(R.CUDA_ERROR_NOT_INITIALIZED)

    def need_context(self) -> int:
        self.need_init()
        ctx = getattr(self._tls, "ctx", None)
        if ctx is None:
            raise _Err(R.CUDA_ERROR_INVALID_CONTEXT)
        return int(ctx)

    def set_current(self, ctx: int | None) -> None:
        self._tls.ctx = ctx

    def new_va(self, size: int, alignment: int) -> int:
        align = max(alignment, GRANULARITY)
        address = (self._va_next + align - 1) // align * align
        self._va_next = address + size + GRANULARITY  # a guard gap between reservations
        return address

    def mapping_at(self, address: int) -> Mapping | None:
        for m in self.mappings.values():
            if m.address <= address < m.address + m.size:
                return m
        return None

    def device_spans(self, address: int, size: int) -> list[tuple[Mapping, int, int]] | None:
        """(mapping, offset within it, length) pieces covering a device range, or None."""
        spans = []
        cursor, end = address, address + size
        while cursor < end:
            m = self.mapping_at(cursor)
            if m is None:
                return None
            inner = cursor - m.address
            length = min(end, m.address + m.size) - cursor
            spans.append((m, inner, length))
            cursor += length
        return spans

    def is_device(self, address: int) -> bool:
        return address >= VA_BASE

    def read_device(self, address: int, size: int) -> bytes | int:
        spans = self.device_spans(address, size)
        if spans is None:
            self.violations.append(f"device read of unmapped {address:#x}+{size}")
            return R.CUDA_ERROR_ILLEGAL_ADDRESS
        out = bytearray()
        for m, inner, length in spans:
            if not m.access & 1:
                self.violations.append(f"device read without access at {m.address:#x}")
                return R.CUDA_ERROR_ILLEGAL_ADDRESS
            start = m.offset + inner
            out += m.alloc.buffer()[start : start + length]
        return bytes(out)

    def write_device(self, address: int, data: bytes) -> int:
        spans = self.device_spans(address, len(data))
        if spans is None:
            self.violations.append(f"device write to unmapped {address:#x}+{len(data)}")
            return R.CUDA_ERROR_ILLEGAL_ADDRESS
        pos = 0
        for m, inner, length in spans:
            if m.access != T.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
                self.violations.append(f"device write without write access at {m.address:#x}")
                return R.CUDA_ERROR_ILLEGAL_ADDRESS
            start = m.offset + inner
            m.alloc.buffer()[start : start + length] = data[pos : pos + length]
            pos += length
        return R.CUDA_SUCCESS

    def read_any(self, address: int, size: int) -> bytes | int:
        if self.is_device(address):
            return self.read_device(address, size)
        if _host_perms(address, size) is None:
            self.violations.append(f"host read of unmapped {address:#x}+{size}")
            return R.CUDA_ERROR_ILLEGAL_ADDRESS
        if not self._registered(address, size):
            self.unpinned_copies += 1
        return ctypes.string_at(address, size)

    def write_any(self, address: int, data: bytes) -> int:
        if self.is_device(address):
            return self.write_device(address, data)
        perms = _host_perms(address, len(data))
        if perms != "rw":
            self.violations.append(f"host write to non-writable {address:#x}+{len(data)}")
            return R.CUDA_ERROR_ILLEGAL_ADDRESS
        if not self._registered(address, len(data)):
            self.unpinned_copies += 1
        ctypes.memmove(address, data, len(data))
        return R.CUDA_SUCCESS

    def _registered(self, address: int, size: int) -> bool:
        return any(
            a <= address and address + size <= a + s for a, (s, _) in self.registered.items()
        )

    def enqueue_copy(self, stream: Any, dst: int, src: int, size: int) -> None:
        def run() -> int:
            data = self.read_any(src, size)
            if isinstance(data, int):
                return data
            return self.write_any(dst, data)

        self.pending.append(
            Op(int(stream), "copy", run, nbytes=size, ranges=((dst, size), (src, size)))
        )

    def run_pending(self, predicate: Callable[[int, Op], bool]) -> int:
        """Run queued ops selected by `predicate(index, op)` in order; first error wins."""
        result = R.CUDA_SUCCESS
        keep = []
        for i, op in enumerate(self.pending):
            if not predicate(i, op):
                keep.append(op)
                continue
            self.clock_s += op.nbytes / self.bandwidth_bytes_per_s
            code = op.run()
            if code != R.CUDA_SUCCESS and result == R.CUDA_SUCCESS:
                result = code
        self.pending = keep
        return result

    def in_flight_on(self, address: int, size: int) -> bool:
        """Whether a queued (not yet synchronized) op touches [address, address+size)."""
        return any(
            a < address + size and address < a + n for op in self.pending for a, n in op.ranges
        )


class _Err(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = int(code)
