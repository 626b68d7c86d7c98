# ruff: noqa: N802, N812 - mirrors the cuda.bindings names
"""The fake's driver and runtime functions, in cuda-bindings 12.x or 13.x signatures.

`install(monkeypatch, fake)` puts `cuda`, `cuda.bindings`, `cuda.bindings.driver` and
`cuda.bindings.runtime` into `sys.modules`, so `from cuda.bindings import driver` in the
code under test resolves to this fake.
"""

from __future__ import annotations

import functools
import os
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.fake_cuda import types as T
from tests.support.fake_cuda.world import (
    GRANULARITY,
    VA_BASE,
    Allocation,
    FakeCuda,
    Mapping,
    Op,
    _Err,
    _host_perms,
)

R = T.CUresult
RW = T.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
POSIX_FD = T.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
READ_ONLY_REGISTER = 0x08


def _api(fake: FakeCuda, name: str, outputs: int, *, runtime: bool = False) -> Callable[..., Any]:
    """Wrap a body: record the call, honour injected failures, map `_Err` to a result tuple."""

    def code_type(code: int) -> Any:
        if runtime:
            try:
                return T.cudaError_t(code)
            except ValueError:
                return code
        return R(code)

    def deco(body: Callable[..., tuple[Any, ...]]) -> Callable[..., tuple[Any, ...]]:
        @functools.wraps(body)
        def fn(*args: Any) -> tuple[Any, ...]:
            injected = fake.record(name, args)
            if injected is not None:
                return (code_type(injected),) + (None,) * outputs
            try:
                with fake._lock:
                    values = body(*args)
            except _Err as e:
                return (code_type(e.code),) + (None,) * outputs
            assert len(values) == outputs, (name, values)
            return (code_type(0), *values)

        fn.__name__ = name
        return fn

    return deco


def _check_location(value: Any, cls: type) -> None:
    if not isinstance(value, cls):
        raise TypeError(f"expected {cls.__name__}, got {type(value).__name__}")


def _check_ordinal(value: Any) -> int:
    if not isinstance(value, int | T.CUdevice):
        raise TypeError(f"expected a device ordinal (int), got {type(value).__name__}")
    return int(value)


def build_driver(fake: FakeCuda) -> types.ModuleType:
    d = types.ModuleType("cuda.bindings.driver")
    for cls in (
        T.CUresult, T.CUdevice_attribute, T.CUmemLocationType, T.CUmemAllocationType,
        T.CUmemAllocationHandleType, T.CUmemAccess_flags, T.CUmemAllocationGranularity_flags,
        T.CUstream_flags, T.CUevent_flags, T.CUmem_advise, T.CUdevice, T.CUdeviceptr,
        T.CUcontext, T.CUstream, T.CUevent, T.CUmemGenericAllocationHandle, T.CUuuid,
        T.CUmemLocation, T.CUmemAllocationProp, T.CUmemAccessDesc,
    ):  # fmt: skip
        setattr(d, cls.__name__, cls)
    d.CU_MEMHOSTREGISTER_PORTABLE = 0x01
    d.CU_MEMHOSTREGISTER_READ_ONLY = READ_ONLY_REGISTER
    d.CU_DEVICE_CPU = -1

    def api(name: str, outputs: int = 0) -> Callable[..., Any]:
        def register(body: Callable[..., tuple[Any, ...]]) -> Callable[..., Any]:
            fn = _api(fake, name, outputs)(body)
            setattr(d, name, fn)
            return fn

        return register

    def device(value: Any) -> int:
        ordinal = _check_ordinal(value)
        fake.need_init()
        if not 0 <= ordinal < len(fake.devices):
            raise _Err(R.CUDA_ERROR_INVALID_DEVICE)
        return ordinal

    def handle(value: Any) -> Allocation:
        alloc = fake.handles.get(int(value))
        if alloc is None:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        return alloc

    def new_handle(alloc: Allocation) -> T.CUmemGenericAllocationHandle:
        value = next(fake._ids) << 8
        fake.handles[value] = alloc
        alloc.handles += 1
        return T.CUmemGenericAllocationHandle(value)

    @api("cuInit")
    def cuInit(flags: int) -> tuple[()]:
        if fake.no_driver:
            raise RuntimeError('Failed to dlopen "libcuda.so.1"')
        if fake.init_error is not None:
            raise _Err(fake.init_error)
        fake.initialized = True
        return ()

    @api("cuDriverGetVersion", 1)
    def cuDriverGetVersion() -> tuple[int]:
        return (13000 if fake.major >= 13 else 12080,)

    @api("cuGetErrorName", 1)
    def cuGetErrorName(code: Any) -> tuple[bytes]:
        return (R(int(code)).name.encode(),)

    @api("cuDeviceGetCount", 1)
    def cuDeviceGetCount() -> tuple[int]:
        fake.need_init()
        return (len(fake.devices),)

    @api("cuDeviceGet", 1)
    def cuDeviceGet(ordinal: int) -> tuple[T.CUdevice]:
        return (T.CUdevice(device(ordinal)),)

    def get_uuid(dev: Any) -> tuple[T.CUuuid]:
        return (T.CUuuid(fake.devices[device(dev)].uuid),)

    api("cuDeviceGetUuid", 1)(get_uuid)
    if fake.major < 13:
        api("cuDeviceGetUuid_v2", 1)(get_uuid)

    @api("cuDeviceGetName", 1)
    def cuDeviceGetName(length: int, dev: Any) -> tuple[bytes]:
        return (fake.devices[device(dev)].name.encode().ljust(length, b"\0"),)

    @api("cuDeviceGetPCIBusId", 1)
    def cuDeviceGetPCIBusId(length: int, dev: Any) -> tuple[bytes]:
        return (fake.devices[device(dev)].pci_bus_id.encode().ljust(length, b"\0"),)

    @api("cuDeviceTotalMem", 1)
    def cuDeviceTotalMem(dev: Any) -> tuple[int]:
        return (fake.devices[device(dev)].total_bytes,)

    @api("cuDeviceGetAttribute", 1)
    def cuDeviceGetAttribute(attr: Any, dev: Any) -> tuple[int]:
        attrs = fake.devices[device(dev)].attributes
        if attr.name not in attrs:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        return (attrs[attr.name],)

    @api("cuDevicePrimaryCtxRetain", 1)
    def cuDevicePrimaryCtxRetain(dev: Any) -> tuple[T.CUcontext]:
        ordinal = device(dev)
        fake.contexts[ordinal] = fake.contexts.get(ordinal, 0) + 1
        return (T.CUcontext(0xC0 + ordinal),)

    @api("cuDevicePrimaryCtxRelease")
    def cuDevicePrimaryCtxRelease(dev: Any) -> tuple[()]:
        ordinal = device(dev)
        if fake.contexts.get(ordinal, 0) <= 0:
            raise _Err(R.CUDA_ERROR_INVALID_CONTEXT)
        fake.contexts[ordinal] -= 1
        return ()

    @api("cuCtxSetCurrent")
    def cuCtxSetCurrent(ctx: Any) -> tuple[()]:
        fake.need_init()
        fake.set_current(int(ctx) if ctx is not None and int(ctx) else None)
        return ()

    @api("cuCtxSynchronize")
    def cuCtxSynchronize() -> tuple[()]:
        fake.need_context()
        code = fake.run_pending(lambda i, op: True)
        if code:
            raise _Err(code)
        return ()

    @api("cuMemGetInfo", 2)
    def cuMemGetInfo() -> tuple[int, int]:
        ordinal = fake.need_context() - 0xC0
        return (fake.free_bytes(ordinal), fake.devices[ordinal].total_bytes)

    # --- VMM ---------------------------------------------------------------------------

    def check_prop(prop: T.CUmemAllocationProp) -> tuple[str, int]:
        if prop.type != T.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        loc = prop.location
        if loc.type == T.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE:
            return "device", device(loc.id)
        if loc.type == T.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA:
            return "host_numa", int(loc.id)
        raise _Err(R.CUDA_ERROR_INVALID_VALUE)

    @api("cuMemGetAllocationGranularity", 1)
    def cuMemGetAllocationGranularity(prop: Any, option: Any) -> tuple[int]:
        fake.need_init()
        check_prop(prop)
        return (GRANULARITY,)

    @api("cuMemCreate", 1)
    def cuMemCreate(size: int, prop: Any, flags: int) -> tuple[T.CUmemGenericAllocationHandle]:
        fake.need_init()
        kind, where = check_prop(prop)
        if prop.requestedHandleTypes != POSIX_FD:
            fake.violations.append("cuMemCreate without the POSIX fd handle type")
        if size <= 0 or size % GRANULARITY or flags:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        fake.collect()
        if kind == "device" and size > fake.free_bytes(where):
            raise _Err(R.CUDA_ERROR_OUT_OF_MEMORY)
        alloc = Allocation(next(fake._ids), size, kind, where)
        fake.allocations[alloc.alloc_id] = alloc
        return (new_handle(alloc),)

    @api("cuMemRelease")
    def cuMemRelease(h: Any) -> tuple[()]:
        fake.need_init()
        alloc = handle(h)
        del fake.handles[int(h)]
        fake.imported_handles.discard(int(h))
        alloc.handles -= 1
        fake.collect()
        return ()

    @api("cuMemExportToShareableHandle", 1)
    def cuMemExportToShareableHandle(h: Any, handle_type: Any, flags: int) -> tuple[int]:
        fake.need_init()
        alloc = handle(h)
        if handle_type != POSIX_FD or flags:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        if int(h) in fake.imported_handles:
            # as driver 580 on an H200 answered (tests/data/cuda_recordings): an imported
            # allocation cannot be exported again, retained from its mapping or not
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        fd = os.memfd_create(f"fake-cuda-{alloc.alloc_id}", os.MFD_CLOEXEC)
        fake.exports[os.fstat(fd).st_ino] = alloc
        return (fd,)

    @api("cuMemImportFromShareableHandle", 1)
    def cuMemImportFromShareableHandle(
        os_handle: Any, handle_type: Any
    ) -> tuple[T.CUmemGenericAllocationHandle]:
        fake.need_init()
        if handle_type != POSIX_FD or not isinstance(os_handle, int):
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        try:
            alloc = fake.exports[os.fstat(os_handle).st_ino]
        except (OSError, KeyError):
            raise _Err(R.CUDA_ERROR_INVALID_VALUE) from None
        if alloc.freed:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        imported = new_handle(alloc)
        fake.imported_handles.add(int(imported))
        return (imported,)

    @api("cuMemRetainAllocationHandle", 1)
    def cuMemRetainAllocationHandle(address: Any) -> tuple[T.CUmemGenericAllocationHandle]:
        fake.need_init()
        m = fake.mapping_at(int(address))
        if m is None:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        retained = new_handle(m.alloc)
        if m.imported:
            fake.imported_handles.add(int(retained))
        return (retained,)

    @api("cuMemGetAllocationPropertiesFromHandle", 1)
    def cuMemGetAllocationPropertiesFromHandle(h: Any) -> tuple[T.CUmemAllocationProp]:
        fake.need_init()
        alloc = handle(h)
        prop = T.CUmemAllocationProp()
        prop.type = T.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        # an imported handle reports no shareable type (as the H200 answered): it cannot be
        # exported again (cuMemExportToShareableHandle below)
        prop.requestedHandleTypes = (
            T.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
            if int(h) in fake.imported_handles
            else POSIX_FD
        )
        prop.location.type = (
            T.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            if alloc.kind == "device"
            else T.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA
        )
        prop.location.id = alloc.where
        return (prop,)

    @api("cuMemAddressReserve", 1)
    def cuMemAddressReserve(
        size: int, alignment: int, addr: int, flags: int
    ) -> tuple[T.CUdeviceptr]:
        fake.need_init()
        if size <= 0 or size % GRANULARITY:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        address = fake.new_va(size, alignment)
        fake.reservations[address] = size
        return (T.CUdeviceptr(address),)

    @api("cuMemAddressFree")
    def cuMemAddressFree(ptr: Any, size: int) -> tuple[()]:
        fake.need_init()
        address = int(ptr)
        if fake.reservations.get(address) != size:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        if any(address <= m.address < address + size for m in fake.mappings.values()):
            fake.violations.append(f"cuMemAddressFree({address:#x}) with mappings inside")
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        del fake.reservations[address]
        return ()

    @api("cuMemMap")
    def cuMemMap(ptr: Any, size: int, offset: int, h: Any, flags: int) -> tuple[()]:
        fake.need_init()
        address = int(ptr)
        alloc = handle(h)
        if size <= 0 or size % GRANULARITY or offset % GRANULARITY or address % GRANULARITY:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        if offset + size > alloc.size:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        if not any(a <= address and address + size <= a + s for a, s in fake.reservations.items()):
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        if any(
            m.address < address + size and address < m.address + m.size
            for m in fake.mappings.values()
        ):
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        fake.mappings[address] = Mapping(
            address, size, alloc, offset, imported=int(h) in fake.imported_handles
        )
        return ()

    @api("cuMemSetAccess")
    def cuMemSetAccess(ptr: Any, size: int, descs: Any, count: int) -> tuple[()]:
        fake.need_init()
        address = int(ptr)
        descs = list(descs)
        if count != len(descs) or not descs:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        spans = fake.device_spans(address, size)
        if spans is None or any(inner or length != m.size for m, inner, length in spans):
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)  # must cover whole mappings
        for desc in descs:
            if desc.location.type != T.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE:
                raise _Err(R.CUDA_ERROR_INVALID_VALUE)
            device(desc.location.id)
        for m, _, _ in spans:
            m.access = int(descs[0].flags)
        return ()

    @api("cuMemUnmap")
    def cuMemUnmap(ptr: Any, size: int) -> tuple[()]:
        fake.need_init()
        address = int(ptr)
        spans = fake.device_spans(address, size)
        if spans is None or any(inner or length != m.size for m, inner, length in spans):
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        if fake.in_flight_on(address, size):
            fake.violations.append(f"cuMemUnmap({address:#x}) with a copy in flight")
        for m, _, _ in spans:
            del fake.mappings[m.address]
        fake.collect()
        return ()

    # --- streams, events, copies ---------------------------------------------------------

    @api("cuStreamCreate", 1)
    def cuStreamCreate(flags: int) -> tuple[T.CUstream]:
        fake.need_context()
        value = next(fake._ids)
        fake.streams.add(value)
        return (T.CUstream(value),)

    @api("cuStreamDestroy")
    def cuStreamDestroy(stream: Any) -> tuple[()]:
        fake.need_context()
        if int(stream) not in fake.streams:
            raise _Err(R.CUDA_ERROR_INVALID_HANDLE)
        fake.streams.discard(int(stream))
        return ()

    @api("cuStreamSynchronize")
    def cuStreamSynchronize(stream: Any) -> tuple[()]:
        fake.need_context()
        code = fake.run_pending(lambda i, op: op.stream == int(stream))
        if code:
            raise _Err(code)
        return ()

    def known_stream(stream: Any) -> int:
        value = int(stream)
        if value and value not in fake.streams:
            raise _Err(R.CUDA_ERROR_INVALID_HANDLE)
        return value

    @api("cuEventCreate", 1)
    def cuEventCreate(flags: int) -> tuple[T.CUevent]:
        fake.need_context()
        value = next(fake._ids)
        fake.events[value] = {"flags": int(flags), "recorded": False, "time": 0.0, "polls": 0}
        return (T.CUevent(value),)

    @api("cuEventDestroy")
    def cuEventDestroy(event: Any) -> tuple[()]:
        fake.need_context()
        if fake.events.pop(int(event), None) is None:
            raise _Err(R.CUDA_ERROR_INVALID_HANDLE)
        return ()

    @api("cuEventRecord")
    def cuEventRecord(event: Any, stream: Any) -> tuple[()]:
        fake.need_context()
        value = int(event)
        if value not in fake.events:
            raise _Err(R.CUDA_ERROR_INVALID_HANDLE)
        s = known_stream(stream)
        state = fake.events[value]
        state["recorded"] = True
        state["polls"] = 0

        def run() -> int:
            state["time"] = fake.clock_s
            return R.CUDA_SUCCESS

        fake.pending.append(Op(s, "record", run, event=value))
        return ()

    def settle(value: int) -> int:
        """Run everything on the event's stream up to its record op."""
        idx = next(
            (i for i, op in enumerate(fake.pending) if op.kind == "record" and op.event == value),
            None,
        )
        if idx is None:
            return R.CUDA_SUCCESS
        stream = fake.pending[idx].stream
        return fake.run_pending(lambda i, op: i <= idx and op.stream == stream)

    @api("cuEventQuery")
    def cuEventQuery(event: Any) -> tuple[()]:
        fake.need_context()
        value = int(event)
        if value not in fake.events:
            raise _Err(R.CUDA_ERROR_INVALID_HANDLE)
        state = fake.events[value]
        pending = any(op.kind == "record" and op.event == value for op in fake.pending)
        if pending and state["polls"] < fake.not_ready_polls:
            state["polls"] += 1
            raise _Err(R.CUDA_ERROR_NOT_READY)
        code = settle(value)
        if code:
            raise _Err(code)
        return ()

    @api("cuEventSynchronize")
    def cuEventSynchronize(event: Any) -> tuple[()]:
        fake.need_context()
        value = int(event)
        if value not in fake.events:
            raise _Err(R.CUDA_ERROR_INVALID_HANDLE)
        code = settle(value)
        if code:
            raise _Err(code)
        return ()

    @api("cuEventElapsedTime", 1)
    def cuEventElapsedTime(start: Any, end: Any) -> tuple[float]:
        fake.need_context()
        a, b = fake.events.get(int(start)), fake.events.get(int(end))
        if a is None or b is None or a["flags"] & 2 or b["flags"] & 2:
            raise _Err(R.CUDA_ERROR_INVALID_HANDLE)
        return ((b["time"] - a["time"]) * 1000.0,)

    def copy_api(name: str, dst_device: bool | None, src_device: bool | None) -> None:
        @api(name)
        def body(dst: Any, src: Any, size: int, stream: Any) -> tuple[()]:
            fake.need_context()
            s = known_stream(stream)
            d, sr = int(dst), int(src)
            if dst_device is not None and fake.is_device(d) != dst_device:
                raise _Err(R.CUDA_ERROR_INVALID_VALUE)
            if src_device is not None and fake.is_device(sr) != src_device:
                raise _Err(R.CUDA_ERROR_INVALID_VALUE)
            fake.enqueue_copy(s, d, sr, size)
            return ()

    copy_api("cuMemcpyHtoDAsync", True, False)
    copy_api("cuMemcpyDtoHAsync", False, True)
    copy_api("cuMemcpyDtoDAsync", True, True)
    copy_api("cuMemcpyAsync", None, None)

    def sync_copy_api(name: str, dst_device: bool, src_device: bool) -> None:
        @api(name)
        def body(dst: Any, src: Any, size: int) -> tuple[()]:
            fake.need_context()
            fake.run_pending(lambda i, op: op.stream == 0)
            if fake.is_device(int(dst)) != dst_device or fake.is_device(int(src)) != src_device:
                raise _Err(R.CUDA_ERROR_INVALID_VALUE)
            fake.enqueue_copy(0, int(dst), int(src), size)
            code = fake.run_pending(lambda i, op: op.stream == 0)
            if code:
                raise _Err(code)
            return ()

    sync_copy_api("cuMemcpyHtoD", True, False)
    sync_copy_api("cuMemcpyDtoH", False, True)

    # --- host memory ---------------------------------------------------------------------

    @api("cuMemHostRegister")
    def cuMemHostRegister(ptr: Any, size: int, flags: int) -> tuple[()]:
        fake.need_context()
        address = int(ptr)
        perms = _host_perms(address, size)
        if perms is None:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        if perms != "rw" and not flags & READ_ONLY_REGISTER:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)  # the driver refuses a read-only mapping
        if any(a < address + size and address < a + s for a, (s, _) in fake.registered.items()):
            raise _Err(R.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        fake.registered[address] = (size, int(flags))
        return ()

    @api("cuMemHostUnregister")
    def cuMemHostUnregister(ptr: Any) -> tuple[()]:
        fake.need_context()
        address = int(ptr)
        if address not in fake.registered:
            raise _Err(R.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
        size = fake.registered[address][0]
        if fake.in_flight_on(address, size):
            fake.violations.append(f"cuMemHostUnregister({address:#x}) with a copy in flight")
        del fake.registered[address]
        return ()

    @api("cuMemAllocHost", 1)
    def cuMemAllocHost(size: int) -> tuple[int]:
        import ctypes

        fake.need_context()
        buf = ctypes.create_string_buffer(size)
        address = ctypes.addressof(buf)
        fake.host_buffers[address] = buf
        fake.registered[address] = (size, 0)
        return (address,)

    @api("cuMemFreeHost")
    def cuMemFreeHost(ptr: Any) -> tuple[()]:
        fake.need_context()
        address = int(ptr)
        if fake.host_buffers.pop(address, None) is None:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        del fake.registered[address]
        return ()

    @api("cuMemAlloc", 1)
    def cuMemAlloc(size: int) -> tuple[T.CUdeviceptr]:
        ordinal = fake.need_context() - 0xC0
        rounded = (size + GRANULARITY - 1) // GRANULARITY * GRANULARITY
        if rounded > fake.free_bytes(ordinal):
            raise _Err(R.CUDA_ERROR_OUT_OF_MEMORY)
        alloc = Allocation(next(fake._ids), rounded, "classic", ordinal)
        fake.allocations[alloc.alloc_id] = alloc
        address = fake.new_va(rounded, GRANULARITY)
        fake.mappings[address] = Mapping(address, rounded, alloc, 0, int(RW))
        return (T.CUdeviceptr(address),)

    @api("cuMemFree")
    def cuMemFree(ptr: Any) -> tuple[()]:
        fake.need_context()
        m = fake.mappings.get(int(ptr))
        if m is None or m.alloc.kind != "classic":
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        del fake.mappings[m.address]
        m.alloc.freed = True
        return ()

    # --- managed memory (driver form; the version difference under test) ------------------

    def managed_target(location: Any) -> int | None:
        if fake.major >= 13:
            _check_location(location, T.CUmemLocation)
            if location.type == T.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE:
                return device(location.id)
            return None
        ordinal = _check_ordinal(location)
        return None if ordinal == -1 else device(ordinal)

    if fake.major >= 13:

        @api("cuMemPrefetchAsync")
        def cuMemPrefetchAsync13(
            ptr: Any, size: int, location: Any, flags: int, stream: Any
        ) -> tuple[()]:
            fake.need_context()
            prefetch(int(ptr), size, managed_target(location), known_stream(stream))
            return ()

        @api("cuMemAdvise")
        def cuMemAdvise13(ptr: Any, size: int, advice: Any, location: Any) -> tuple[()]:
            fake.need_init()
            managed_target(location)
            return ()

    else:

        @api("cuMemPrefetchAsync")
        def cuMemPrefetchAsync12(ptr: Any, size: int, dst_device: Any, stream: Any) -> tuple[()]:
            fake.need_context()
            prefetch(int(ptr), size, managed_target(dst_device), known_stream(stream))
            return ()

        @api("cuMemAdvise")
        def cuMemAdvise12(ptr: Any, size: int, advice: Any, dev: Any) -> tuple[()]:
            fake.need_init()
            managed_target(dev)
            return ()

        @api("cuMemPrefetchAsync_v2")
        def cuMemPrefetchAsync_v2(
            ptr: Any, size: int, location: Any, flags: int, stream: Any
        ) -> tuple[()]:
            raise AssertionError("modelswap uses the plain 12.x prefetch, not _v2")

    def prefetch(address: int, size: int, target: int | None, stream: int) -> None:
        entry = fake.managed.get(address)
        if entry is None or entry[0].size != size:
            raise _Err(R.CUDA_ERROR_INVALID_VALUE)
        alloc = entry[0]

        def run() -> int:
            moving = target is not None and fake.managed_resident.get(alloc.alloc_id) != target
            if moving and size > fake.free_bytes(target):  # type: ignore[arg-type]
                return R.CUDA_ERROR_OUT_OF_MEMORY
            fake.managed_resident[alloc.alloc_id] = target
            return R.CUDA_SUCCESS

        fake.pending.append(Op(stream, "prefetch", run, nbytes=size, ranges=((address, size),)))

    fake.prefetch = prefetch  # type: ignore[attr-defined] - shared with the runtime fake
    return d


def build_runtime(fake: FakeCuda) -> types.ModuleType:
    """The runtime calls the managed mapper uses; device 0's primary context is implied."""
    rt = types.ModuleType("cuda.bindings.runtime")
    for cls in (
        T.cudaError_t, T.cudaMemLocationType, T.cudaMemoryAdvise, T.cudaMemcpyKind,
        T.cudaDeviceAttr, T.cudaStream_t, T.cudaEvent_t, T.cudaMemLocation,
    ):  # fmt: skip
        setattr(rt, cls.__name__, cls)
    rt.cudaCpuDeviceId = -1
    rt.cudaMemAttachGlobal = 0x01
    rt.cudaStreamNonBlocking = 0x01
    rt.cudaEventDisableTiming = 0x02
    rt.cudaHostRegisterPortable = 0x01
    rt.cudaHostRegisterReadOnly = READ_ONLY_REGISTER
    driver = sys.modules["cuda.bindings.driver"]

    def api(name: str, outputs: int = 0) -> Callable[..., Any]:
        def register(body: Callable[..., tuple[Any, ...]]) -> Callable[..., Any]:
            fn = _api(fake, name, outputs, runtime=True)(body)
            setattr(rt, name, fn)
            return fn

        return register

    def implicit_context() -> None:
        if not fake.initialized:
            fake.initialized = True  # the runtime initializes the driver itself
        if getattr(fake._tls, "ctx", None) is None:
            fake.set_current(0xC0 + getattr(fake._tls, "rt_device", 0))

    def forward(name: str, *args: Any) -> tuple[Any, ...]:
        implicit_context()
        result = getattr(driver, name)(*args)
        fake.calls.pop()  # the driver call is an implementation detail of the runtime one
        if int(result[0]):
            raise _Err(int(result[0]))
        return tuple(result[1:])

    @api("cudaGetErrorName", 1)
    def cudaGetErrorName(code: Any) -> tuple[bytes]:
        try:
            return (T.cudaError_t(int(code)).name.encode(),)
        except ValueError:
            return (b"cudaErrorUnknown",)

    @api("cudaSetDevice")
    def cudaSetDevice(ordinal: int) -> tuple[()]:
        fake._tls.rt_device = _check_ordinal(ordinal)
        fake._tls.ctx = None
        implicit_context()
        return ()

    @api("cudaGetDeviceCount", 1)
    def cudaGetDeviceCount() -> tuple[int]:
        implicit_context()
        return (len(fake.devices),)

    @api("cudaDeviceGetAttribute", 1)
    def cudaDeviceGetAttribute(attr: Any, ordinal: int) -> tuple[int]:
        implicit_context()
        name = {
            T.cudaDeviceAttr.cudaDevAttrConcurrentManagedAccess: "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS",
            T.cudaDeviceAttr.cudaDevAttrPageableMemoryAccessUsesHostPageTables: "CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES",
        }[attr]
        return (fake.devices[ordinal].attributes[name],)

    @api("cudaMemGetInfo", 2)
    def cudaMemGetInfo() -> tuple[int, int]:
        implicit_context()
        ordinal = getattr(fake._tls, "rt_device", 0)
        return (fake.free_bytes(ordinal), fake.devices[ordinal].total_bytes)

    @api("cudaMallocManaged", 1)
    def cudaMallocManaged(size: int, flags: int) -> tuple[int]:
        import ctypes

        implicit_context()
        if size <= 0:
            raise _Err(T.cudaError_t.cudaErrorInvalidValue)
        buf = ctypes.create_string_buffer(size)
        address = ctypes.addressof(buf)
        ordinal = getattr(fake._tls, "rt_device", 0)
        alloc = Allocation(next(fake._ids), size, "managed", ordinal)
        fake.allocations[alloc.alloc_id] = alloc
        fake.managed[address] = (alloc, buf)
        fake.managed_resident[alloc.alloc_id] = None
        return (address,)

    @api("cudaFree")
    def cudaFree(ptr: int) -> tuple[()]:
        implicit_context()
        entry = fake.managed.pop(int(ptr), None)
        if entry is None:
            raise _Err(T.cudaError_t.cudaErrorInvalidValue)
        entry[0].freed = True
        fake.managed_resident.pop(entry[0].alloc_id, None)
        return ()

    def rt_target(location: Any) -> int | None:
        if fake.major >= 13:
            _check_location(location, T.cudaMemLocation)
            if location.type == T.cudaMemLocationType.cudaMemLocationTypeDevice:
                return int(location.id)
            return None
        ordinal = _check_ordinal(location)
        return None if ordinal == -1 else ordinal

    if fake.major >= 13:

        @api("cudaMemPrefetchAsync")
        def cudaMemPrefetchAsync13(
            ptr: int, size: int, location: Any, flags: int, stream: Any
        ) -> tuple[()]:
            implicit_context()
            fake.prefetch(int(ptr), size, rt_target(location), int(stream))  # type: ignore[attr-defined]
            return ()

        @api("cudaMemAdvise")
        def cudaMemAdvise13(ptr: int, size: int, advice: Any, location: Any) -> tuple[()]:
            implicit_context()
            rt_target(location)
            if int(ptr) not in fake.managed:
                raise _Err(T.cudaError_t.cudaErrorInvalidValue)
            return ()

    else:

        @api("cudaMemPrefetchAsync")
        def cudaMemPrefetchAsync12(ptr: int, size: int, dst: Any, stream: Any) -> tuple[()]:
            implicit_context()
            fake.prefetch(int(ptr), size, rt_target(dst), int(stream))  # type: ignore[attr-defined]
            return ()

        @api("cudaMemAdvise")
        def cudaMemAdvise12(ptr: int, size: int, advice: Any, dev: Any) -> tuple[()]:
            implicit_context()
            rt_target(dev)
            if int(ptr) not in fake.managed:
                raise _Err(T.cudaError_t.cudaErrorInvalidValue)
            return ()

    @api("cudaStreamCreateWithFlags", 1)
    def cudaStreamCreateWithFlags(flags: int) -> tuple[T.cudaStream_t]:
        (stream,) = forward("cuStreamCreate", flags)
        return (T.cudaStream_t(int(stream)),)

    @api("cudaStreamDestroy")
    def cudaStreamDestroy(stream: Any) -> tuple[()]:
        forward("cuStreamDestroy", stream)
        return ()

    @api("cudaEventCreateWithFlags", 1)
    def cudaEventCreateWithFlags(flags: int) -> tuple[T.cudaEvent_t]:
        (event,) = forward("cuEventCreate", flags)
        return (T.cudaEvent_t(int(event)),)

    @api("cudaEventDestroy")
    def cudaEventDestroy(event: Any) -> tuple[()]:
        forward("cuEventDestroy", event)
        return ()

    @api("cudaEventRecord")
    def cudaEventRecord(event: Any, stream: Any) -> tuple[()]:
        forward("cuEventRecord", event, stream)
        return ()

    @api("cudaEventQuery")
    def cudaEventQuery(event: Any) -> tuple[()]:
        forward("cuEventQuery", event)
        return ()

    @api("cudaEventSynchronize")
    def cudaEventSynchronize(event: Any) -> tuple[()]:
        forward("cuEventSynchronize", event)
        return ()

    @api("cudaDeviceSynchronize")
    def cudaDeviceSynchronize() -> tuple[()]:
        forward("cuCtxSynchronize")
        return ()

    @api("cudaMemcpyAsync")
    def cudaMemcpyAsync(dst: int, src: int, size: int, kind: Any, stream: Any) -> tuple[()]:
        forward("cuMemcpyAsync", dst, src, size, stream)
        return ()

    @api("cudaHostRegister")
    def cudaHostRegister(ptr: int, size: int, flags: int) -> tuple[()]:
        forward("cuMemHostRegister", ptr, size, flags)
        return ()

    @api("cudaHostUnregister")
    def cudaHostUnregister(ptr: int) -> tuple[()]:
        forward("cuMemHostUnregister", ptr)
        return ()

    return rt


def managed_view(fake: FakeCuda, address: int, size: int) -> bytes:
    """The bytes of a managed allocation (host-accessible, as on a Grace system)."""
    import ctypes

    assert address in fake.managed
    return ctypes.string_at(address, size)


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeCuda) -> FakeCuda:
    """Expose `fake` as `cuda.bindings` (version `fake.major`) for the rest of the test."""
    package = types.ModuleType("cuda")
    package.__path__ = []
    bindings = types.ModuleType("cuda.bindings")
    bindings.__path__ = []
    bindings.__version__ = "13.0.1" if fake.major >= 13 else "12.9.0"
    package.bindings = bindings  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda", package)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    driver = build_driver(fake)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)
    bindings.driver = driver  # type: ignore[attr-defined]
    runtime = build_runtime(fake)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", runtime)
    bindings.runtime = runtime  # type: ignore[attr-defined]
    return fake


__all__ = ["VA_BASE", "FakeCuda", "install", "managed_view"]
