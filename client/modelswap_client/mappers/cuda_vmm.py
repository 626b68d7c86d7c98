"""The `cuda-vmm` mapper: agent-exported HBM chunks mapped at stable device addresses.

One mapper per model process and GPU. It keeps the device's primary context current on
every thread that calls it (`cuDevicePrimaryCtxRetain` + `cuCtxSetCurrent`, so it shares
the context PyTorch/CuPy use), and implements the `Mapper` contract with the VMM API:

- `reserve` → `cuMemAddressReserve` (once per model region; addresses never move)
- `import_fd` → `cuMemImportFromShareableHandle`, then the fd is closed (an open fd pins
  the physical memory even after both sides release)
- `map` → `cuMemMap` at the caller's offset, no access; `set_access` → `cuMemSetAccess`
  over whole contiguous mappings
- `unmap` → `cuCtxSynchronize` (nothing may still touch the range: copies, or the
  model's own kernels on other streams) then `cuMemUnmap`; `release` → `cuMemRelease`
- `export_fd` (readopt after an agent restart) → `cuMemRetainAllocationHandle` on the
  address the chunk is mapped at + `cuMemExportToShareableHandle` + `cuMemRelease` of the
  retained handle (the fd proves what is mapped there, not what we think we imported)
- `map_host` → `mmap` of the host-store file + `cuMemHostRegister` (pinned copies;
  `CU_MEMHOSTREGISTER_READ_ONLY` for the read-only weight copy)
- copies → `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` split into `chunk_bytes` pieces on
  the mapper's own non-blocking streams, completion by a `cuEvent` recorded after them.

Every method either completes or undoes its own partial work before raising, so callers
roll back a failed swap by undoing only the calls that returned. Chunk i+1 can be
imported, mapped and given access while chunk i's copy runs: copies are asynchronous and
VMM calls do not wait for streams.

Standard library and `cuda.bindings` only (through `modelswap_client.cuda_compat`).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from modelswap_client import cuda_compat as cc
from modelswap_client.mappers import _host_files
from modelswap_client.mappers._events import RecordedEvent
from modelswap_client.mappers.base import (
    GRANULARITY_BYTES,
    CopyError,
    CopyEvent,
    Handle,
    HostBuffer,
    Mapper,
    MapperError,
    Reservation,
)

log = logging.getLogger(__name__)

MIB = 1 << 20
DEFAULT_CHUNK_BYTES = 256 * MIB


@dataclass(slots=True)
class _Mapping:
    address: int
    size_bytes: int
    handle_id: int
    offset_bytes: int
    access: str = ""  # "" (none until set_access), "r" or "rw"


@dataclass(slots=True)
class _Host:
    buffer: HostBuffer
    registered: bool


def resolve_device(b: cc.Bindings, device: int | str) -> int:
    """A CUDA ordinal for `device`: an ordinal, or a GPU UUID (``GPU-…``) the agent sent.

    The agent keys GPUs by UUID because ordinals depend on each process's
    `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`; the client maps the UUID to its own.
    """
    if isinstance(device, int):
        return device
    count = cc.check(b, "cuDeviceGetCount", b.driver.cuDeviceGetCount())
    for ordinal in range(int(count)):
        dev = cc.check(b, "cuDeviceGet", b.driver.cuDeviceGet(ordinal))
        if cc.device_uuid(b, dev).lower() == device.lower():
            return ordinal
    raise MapperError(f"GPU {device} is not visible to this process ({count} visible)")


class CudaCopyEvent(RecordedEvent):
    """A `cuEvent` recorded after one copy's pieces. Destroyed once it has been seen done."""

    def __init__(self, mapper: CudaVmmMapper, event: Any, what: str) -> None:
        super().__init__(event, what)
        self._mapper = mapper

    def _query(self, event: Any) -> tuple[bool, BaseException | None]:
        b = self._mapper._b
        self._mapper._current()
        result = b.driver.cuEventQuery(event)
        code = cc.code_of(result)
        if code == cc.CUDA_ERROR_NOT_READY:
            return False, None
        return True, None if code == cc.CUDA_SUCCESS else _copy_error(b, "cuEventQuery", result)

    def _synchronize(self, event: Any) -> BaseException | None:
        b = self._mapper._b
        self._mapper._current()
        result = b.driver.cuEventSynchronize(event)
        ok = cc.code_of(result) == cc.CUDA_SUCCESS
        return None if ok else _copy_error(b, "cuEventSynchronize", result)

    def _release(self, event: Any) -> None:
        self._mapper._event_done(self, event)


def _copy_error(b: cc.Bindings, call: str, result: Any) -> cc.CudaError:
    return cc.CudaError(call, cc.code_of(result), cc.error_name(b, result[0]))


class CudaVmmMapper(Mapper):
    """See the module doc. `device` is an ordinal or a GPU UUID."""

    name = "cuda-vmm"
    supports_fds = True

    @property
    def on_device(self) -> bool:
        return True

    @property
    def host_accessible(self) -> bool:
        return False  # cuMemMap'd memory: only copies and kernels reach it

    @property
    def device_ordinal(self) -> int:
        return self.ordinal

    def __init__(
        self,
        *,
        device: int | str = 0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        streams: int = 2,
        bindings: cc.Bindings | None = None,
    ) -> None:
        if chunk_bytes <= 0 or chunk_bytes % GRANULARITY_BYTES:
            raise MapperError(f"chunk_bytes {chunk_bytes} is not a multiple of 2 MiB")
        if streams < 1:
            raise MapperError("at least one copy stream is needed")
        try:
            self._b = bindings or cc.load()
            cc.initialize(self._b)
        except cc.CudaUnavailable as e:
            raise MapperError(f"cuda-vmm mapper unavailable: {e}") from e
        self.chunk_bytes = chunk_bytes
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._reservations: dict[int, int] = {}
        #: handle_id -> (bindings handle, size, the fd it was imported from). The fd is kept
        #: while the handle lives because it is the only way to hand the chunk on: the
        #: driver refuses to export an imported allocation again (CUDA_ERROR_INVALID_VALUE
        #: from cuMemExportToShareableHandle, retained from its mapping or not; driver 580
        #: on an H200). A kept fd holds the chunk no longer than the handle does: both go
        #: at `release`.
        self._handles: dict[int, tuple[Any, int, int]] = {}
        self._mappings: dict[int, _Mapping] = {}
        self._hosts: dict[int, _Host] = {}
        self._outstanding: set[CudaCopyEvent] = set()
        self._events_lock = threading.Lock()
        self._streams: list[Any] = []
        self._closed = False
        d = self._b.driver
        try:
            self.ordinal = resolve_device(self._b, device)
            self._device = self._call("cuDeviceGet", d.cuDeviceGet(self.ordinal))
            self.uuid = cc.device_uuid(self._b, self._device)
        except cc.CudaError as e:
            raise MapperError(f"GPU {device}: {e}") from e
        self._ctx = self._call("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(self._device))
        try:
            self._current()
            flags = d.CUstream_flags.CU_STREAM_NON_BLOCKING
            for _ in range(streams):
                self._streams.append(self._call("cuStreamCreate", d.cuStreamCreate(flags)))
            self._read_only_register = self._attribute(
                "CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED", 0
            )
        except BaseException:
            for stream in self._streams:
                d.cuStreamDestroy(stream)
            self._streams.clear()
            d.cuDevicePrimaryCtxRelease(self._device)
            raise
        log.info(
            "cuda-vmm mapper on GPU %d (%s), bindings %s, %d streams, %d MiB copy chunks",
            self.ordinal,
            self.uuid,
            self._b.version,
            streams,
            chunk_bytes // MIB,
        )

    # --- helpers --------------------------------------------------------------------------

    def _call(self, name: str, result: Any) -> Any:
        try:
            return cc.check(self._b, name, result)
        except cc.CudaError as e:
            raise MapperError(str(e)) from e

    def _current(self) -> None:
        """Make the primary context current on the calling thread (CUDA's is per thread)."""
        if getattr(self._tls, "current", False):
            return
        self._call("cuCtxSetCurrent", self._b.driver.cuCtxSetCurrent(self._ctx))
        self._tls.current = True

    def _attribute(self, name: str, default: int) -> int:
        attr = getattr(self._b.driver.CUdevice_attribute, name, None)
        if attr is None:
            return default
        result = self._b.driver.cuDeviceGetAttribute(attr, self._device)
        return int(result[1]) if cc.code_of(result) == cc.CUDA_SUCCESS else default

    @staticmethod
    def _aligned(*values: int) -> None:
        for v in values:
            if v % GRANULARITY_BYTES:
                raise MapperError(f"{v:#x} is not a multiple of the 2 MiB granularity")

    def _reservation_of(self, address: int, size: int) -> int:
        for base, length in self._reservations.items():
            if base <= address and address + size <= base + length:
                return base
        raise MapperError(f"[{address:#x}, +{size}) is not inside a reservation")

    def _covering(self, address: int, size: int) -> list[_Mapping]:
        """The whole mappings that exactly tile [address, address+size), or MapperError."""
        found = []
        cursor = address
        while cursor < address + size:
            m = self._mappings.get(cursor)
            if m is None:
                raise MapperError(f"{cursor:#x} is not the start of a mapping")
            found.append(m)
            cursor += m.size_bytes
        if cursor != address + size:
            raise MapperError(f"[{address:#x}, +{size}) ends inside a mapping")
        return found

    def _mapped_span(self, address: int, size: int, need: str) -> None:
        """Check a device range lies in mappings with access `need` ("r" or "rw")."""
        cursor, end = address, address + size
        while cursor < end:
            m = next(
                (
                    m
                    for m in self._mappings.values()
                    if m.address <= cursor < m.address + m.size_bytes
                ),
                None,
            )
            if m is None:
                raise MapperError(f"device address {cursor:#x} is not mapped")
            if need not in m.access and not (need == "r" and m.access == "rw"):
                raise MapperError(f"mapping at {m.address:#x} lacks {need!r} access (set_access)")
            cursor = m.address + m.size_bytes

    def _host_span(self, address: int, size: int, *, write: bool) -> _Host:
        for host in self._hosts.values():
            buf = host.buffer
            if buf.address <= address and address + size <= buf.address + buf.size_bytes:
                if write and not buf.writable:
                    raise MapperError(f"host buffer at {buf.address:#x} is read-only")
                return host
        raise MapperError(f"host range [{address:#x}, +{size}) is not a map_host buffer")

    def _stream(self, index: int) -> Any:
        if not 0 <= index < len(self._streams):
            raise MapperError(f"stream {index} out of range (0..{len(self._streams) - 1})")
        return self._streams[index]

    def _event_done(self, event: CudaCopyEvent, cu_event: Any) -> None:
        # lock order: an event's lock, then `_events_lock`; never the mapper lock here
        with self._events_lock:
            self._outstanding.discard(event)
        result = self._b.driver.cuEventDestroy(cu_event)
        if cc.code_of(result) != cc.CUDA_SUCCESS:
            log.warning("cuEventDestroy failed: %s", cc.error_name(self._b, result[0]))

    # --- Mapper ---------------------------------------------------------------------------

    def granularity_bytes(self) -> int:
        return GRANULARITY_BYTES

    def reserve(self, size_bytes: int) -> Reservation:
        self._aligned(size_bytes)
        if size_bytes <= 0:
            raise MapperError("cannot reserve 0 bytes")
        with self._lock:
            self._current()
            ptr = self._call(
                "cuMemAddressReserve",
                self._b.driver.cuMemAddressReserve(size_bytes, GRANULARITY_BYTES, 0, 0),
            )
            address = cc.as_int(ptr)
            self._reservations[address] = size_bytes
        log.debug("reserved %d MiB at %#x", size_bytes // MIB, address)
        return Reservation(address, size_bytes)

    def free_reservation(self, reservation: Reservation) -> None:
        with self._lock:
            if self._reservations.get(reservation.address) != reservation.size_bytes:
                raise MapperError(f"no reservation {reservation}")
            end = reservation.address + reservation.size_bytes
            if any(reservation.address <= a < end for a in self._mappings):
                raise MapperError(f"reservation at {reservation.address:#x} still has mappings")
            self._call(
                "cuMemAddressFree",
                self._b.driver.cuMemAddressFree(reservation.address, reservation.size_bytes),
            )
            del self._reservations[reservation.address]

    def import_fd(self, fd: int, size_bytes: int) -> Handle:
        """Import a chunk; takes `fd` over (kept for readopt, closed at `release`)."""
        try:
            self._aligned(size_bytes)
            handle = self._call(
                "cuMemImportFromShareableHandle",
                self._b.driver.cuMemImportFromShareableHandle(fd, cc.posix_fd_handle_type(self._b)),
            )
        except BaseException:
            os.close(fd)
            raise
        handle_id = cc.as_int(handle)
        with self._lock:
            self._handles[handle_id] = (handle, size_bytes, fd)
        return Handle(handle_id, size_bytes)

    def _handle(self, handle: Handle) -> Any:
        try:
            return self._handles[handle.handle_id][0]
        except KeyError:
            raise MapperError(f"unknown or released handle {handle.handle_id:#x}") from None

    def export_fd(self, handle: Handle) -> int:
        """A new fd of an imported chunk (a dup of the one it was imported from)."""
        with self._lock:
            self._handle(handle)
            return self._dup(handle.handle_id)

    def export_mapped_fd(self, address: int) -> int:
        """Readopt by address: a new fd for whatever chunk is mapped at `address`."""
        with self._lock:
            mapped = self._mappings.get(address)
            if mapped is None:
                raise MapperError(f"nothing is mapped at {address:#x}")
            return self._dup(mapped.handle_id)

    def _dup(self, handle_id: int) -> int:
        fd = self._handles[handle_id][2]
        if fd < 0:
            raise MapperError(f"handle {handle_id:#x} is being released")
        return os.dup(fd)

    def release(self, handle: Handle) -> None:
        with self._lock:
            own = self._handle(handle)
            if any(m.handle_id == handle.handle_id for m in self._mappings.values()):
                raise MapperError(f"handle {handle.handle_id:#x} is still mapped")
            _, size, fd = self._handles[handle.handle_id]
            if fd >= 0:  # first: the handle is then the last reference this process holds
                os.close(fd)
                self._handles[handle.handle_id] = (own, size, -1)  # a failed release retries
            self._call("cuMemRelease", self._b.driver.cuMemRelease(own))
            del self._handles[handle.handle_id]

    def map(self, address: int, size_bytes: int, handle: Handle, offset_bytes: int = 0) -> None:
        self._aligned(address, size_bytes, offset_bytes)
        with self._lock:
            own = self._handle(handle)
            if size_bytes <= 0 or offset_bytes + size_bytes > handle.size_bytes:
                raise MapperError(
                    f"map of {size_bytes} bytes at offset {offset_bytes} exceeds the "
                    f"{handle.size_bytes}-byte chunk"
                )
            self._reservation_of(address, size_bytes)
            end = address + size_bytes
            if any(
                m.address < end and address < m.address + m.size_bytes
                for m in self._mappings.values()
            ):
                raise MapperError(f"[{address:#x}, +{size_bytes}) overlaps a mapping")
            self._call(
                "cuMemMap", self._b.driver.cuMemMap(address, size_bytes, offset_bytes, own, 0)
            )
            self._mappings[address] = _Mapping(address, size_bytes, handle.handle_id, offset_bytes)

    def set_access(self, address: int, size_bytes: int, *, writable: bool = True) -> None:
        with self._lock:
            covered = self._covering(address, size_bytes)
            desc = cc.access_desc(self._b, self.ordinal, writable=writable)
            self._call(
                "cuMemSetAccess", self._b.driver.cuMemSetAccess(address, size_bytes, [desc], 1)
            )
            for m in covered:
                m.access = "rw" if writable else "r"

    def unmap(self, address: int, size_bytes: int) -> None:
        with self._lock:
            m = self._mappings.get(address)
            if m is None or m.size_bytes != size_bytes:
                raise MapperError(f"[{address:#x}, +{size_bytes}) is not one whole mapping")
            self.synchronize()  # nothing may touch the range once it is unmapped
            self._call("cuMemUnmap", self._b.driver.cuMemUnmap(address, size_bytes))
            del self._mappings[address]

    def map_host(self, fd: int, size_bytes: int, *, writable: bool = False) -> HostBuffer:
        if size_bytes <= 0:
            raise MapperError("cannot map 0 host bytes")
        try:
            address = _host_files.map_file(fd, size_bytes, writable=writable)
        except OSError as e:
            raise MapperError(f"mmap of host-store fd {fd}: {e}") from e
        buffer = HostBuffer(address, size_bytes, writable)
        d = self._b.driver
        registered = True
        try:
            with self._lock:
                self._current()
                if writable:
                    flags = 0
                elif self._read_only_register:
                    flags = cc.define(d, "CU_MEMHOSTREGISTER_READ_ONLY")
                else:
                    flags = -1
                if flags < 0:  # the device cannot pin read-only pages: copies are pageable
                    registered = False
                    log.warning(
                        "GPU %d cannot register read-only host memory; copies from the "
                        "weight copy will be pageable (slower)",
                        self.ordinal,
                    )
                else:
                    self._call("cuMemHostRegister", d.cuMemHostRegister(address, size_bytes, flags))
                self._hosts[address] = _Host(buffer, registered)
        except BaseException:
            _host_files.unmap_file(address, size_bytes)
            raise
        return buffer

    def unmap_host(self, buffer: HostBuffer) -> None:
        with self._lock:
            host = self._hosts.get(buffer.address)
            if host is None or host.buffer != buffer:
                raise MapperError(f"unknown host buffer {buffer}")
            self.synchronize()
            if host.registered:
                self._call(
                    "cuMemHostUnregister", self._b.driver.cuMemHostUnregister(buffer.address)
                )
            del self._hosts[buffer.address]
            try:
                _host_files.unmap_file(buffer.address, buffer.size_bytes)
            except OSError as e:
                raise MapperError(str(e)) from e

    def stream_count(self) -> int:
        return len(self._streams)

    def copy_to_device(
        self, dst_address: int, src_address: int, size_bytes: int, stream: int = 0
    ) -> CopyEvent:
        with self._lock:
            self._mapped_span(dst_address, size_bytes, "rw")
            self._host_span(src_address, size_bytes, write=False)
            return self._copy(
                "cuMemcpyHtoDAsync", dst_address, src_address, size_bytes, self._stream(stream)
            )

    def copy_to_host(
        self, dst_address: int, src_address: int, size_bytes: int, stream: int = 0
    ) -> CopyEvent:
        with self._lock:
            self._mapped_span(src_address, size_bytes, "r")
            self._host_span(dst_address, size_bytes, write=True)
            return self._copy(
                "cuMemcpyDtoHAsync", dst_address, src_address, size_bytes, self._stream(stream)
            )

    def _copy(self, call: str, dst: int, src: int, size: int, stream: Any) -> CopyEvent:
        if size <= 0:
            raise MapperError("copy of 0 bytes")
        d = self._b.driver
        self._current()
        event = self._call(
            "cuEventCreate", d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        )
        issue = getattr(d, call)
        try:
            for offset in range(0, size, self.chunk_bytes):
                piece = min(self.chunk_bytes, size - offset)
                self._call(call, issue(dst + offset, src + offset, piece, stream))
            self._call("cuEventRecord", d.cuEventRecord(event, stream))
        except BaseException:
            # pieces already queued must finish before the caller may touch the ranges
            d.cuStreamSynchronize(stream)
            d.cuEventDestroy(event)
            raise
        copy_event = CudaCopyEvent(self, event, f"{call} of {size} bytes")
        with self._events_lock:
            self._outstanding.add(copy_event)
        return copy_event

    def synchronize(self) -> None:
        with self._lock:
            self._current()
            result = self._b.driver.cuCtxSynchronize()
            error = (
                None
                if cc.code_of(result) == cc.CUDA_SUCCESS
                else _copy_error(self._b, "cuCtxSynchronize", result)
            )
            with self._events_lock:
                events = list(self._outstanding)
            for event in events:
                with event._lock:
                    event._finish(error)
        if error is not None:
            raise CopyError(f"copies failed: {error}") from error

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            d = self._b.driver
            try:
                self.synchronize()
            except CopyError as e:
                log.warning("closing cuda-vmm mapper after a failed copy: %s", e)
            for stream in self._streams:
                result = d.cuStreamDestroy(stream)
                if cc.code_of(result) != cc.CUDA_SUCCESS:
                    log.warning("cuStreamDestroy: %s", cc.error_name(self._b, result[0]))
            self._streams.clear()
            for _handle, _size, fd in self._handles.values():  # handles never released
                if fd >= 0:
                    os.close(fd)
            result = d.cuDevicePrimaryCtxRelease(self._device)
            if cc.code_of(result) != cc.CUDA_SUCCESS:
                log.warning("cuDevicePrimaryCtxRelease: %s", cc.error_name(self._b, result[0]))

    # --- introspection for the client library and views ------------------------------------

    def mapped_ranges(self) -> list[tuple[int, int]]:
        """(address, size) of every live mapping, sorted (for readopt by address)."""
        with self._lock:
            return sorted((m.address, m.size_bytes) for m in self._mappings.values())
