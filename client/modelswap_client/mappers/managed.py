"""The `managed` mapper: CUDA managed memory paged by prefetch (Grace systems, in-process).

On GH200/GB200 the GPU reaches host LPDDR over NVLink-C2C and managed memory migrates
between HBM and host at link speed, so a model can be "swapped" without a second
process: `reserve` is `cudaMallocManaged` (addresses never change) with the GPU advised
as preferred location; `prefetch_to_host` advises the CPU and prefetches there (HBM is
freed once the prefetch completes); `prefetch_to_device` does the reverse. Managed memory
cannot be exported to or imported from another process, so `supports_fds` is False and
the fd/mapping calls raise `MapperError`. The mapper never asks for more managed memory,
or prefetches more to the GPU, than `cudaMemGetInfo` says is free.

These two prefetch calls are additions to the `Mapper` interface (the engine's in-process
path uses them); everything else keeps the base contract. The 12.x/13.x signature
differences of `cudaMemAdvise` / `cudaMemPrefetchAsync` live in `cuda_compat`.
"""

from __future__ import annotations

import logging
import os
import threading
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
from modelswap_client.mappers.cuda_vmm import resolve_device

log = logging.getLogger(__name__)

MIB = 1 << 20
_NO_FDS = "managed memory cannot be shared with another process (no fds, no mappings)"


class _RtEvent(RecordedEvent):
    """A runtime event recorded after a copy or prefetch."""

    def __init__(self, mapper: ManagedMapper, event: Any, what: str) -> None:
        super().__init__(event, what)
        self._mapper = mapper

    def _query(self, event: Any) -> tuple[bool, BaseException | None]:
        result = self._mapper._rt.cudaEventQuery(event)
        code = cc.code_of(result)
        if code == cc.CUDA_RT_ERROR_NOT_READY:
            return False, None
        ok = code == cc.CUDA_SUCCESS
        return True, None if ok else self._mapper._err("cudaEventQuery", result)

    def _synchronize(self, event: Any) -> BaseException | None:
        result = self._mapper._rt.cudaEventSynchronize(event)
        ok = cc.code_of(result) == cc.CUDA_SUCCESS
        return None if ok else self._mapper._err("cudaEventSynchronize", result)

    def _release(self, event: Any) -> None:
        self._mapper._event_done(self, event)


class ManagedMapper(Mapper):
    """See the module doc. `device` is an ordinal or a GPU UUID."""

    name = "managed"
    supports_fds = False

    @property
    def on_device(self) -> bool:
        return True

    @property
    def host_accessible(self) -> bool:
        return True  # unified memory: the CPU faults pages over

    @property
    def device_ordinal(self) -> int:
        return self.ordinal

    def __init__(
        self,
        *,
        device: int | str = 0,
        chunk_bytes: int = 256 * MIB,
        streams: int = 2,
        headroom_bytes: int = 0,
        bindings: cc.Bindings | None = None,
    ) -> None:
        if streams < 1 or chunk_bytes <= 0:
            raise MapperError("need at least one stream and a positive chunk size")
        try:
            self._b = bindings or cc.load(runtime=True)
            cc.initialize(self._b)
        except cc.CudaUnavailable as e:
            raise MapperError(f"managed mapper unavailable: {e}") from e
        assert self._b.runtime is not None
        self._rt = self._b.runtime
        self.chunk_bytes = chunk_bytes
        self.headroom_bytes = headroom_bytes
        self._lock = threading.RLock()
        self._events_lock = threading.Lock()
        self._outstanding: set[_RtEvent] = set()
        self._allocations: dict[int, int] = {}  # address -> size
        self._on_device: dict[int, bool] = {}  # address -> preferred location is the GPU
        self._hosts: dict[int, HostBuffer] = {}
        self._streams: list[Any] = []
        self._closed = False
        try:
            self.ordinal = resolve_device(self._b, device)
        except cc.CudaError as e:
            raise MapperError(f"GPU {device}: {e}") from e
        rt = self._rt
        self._call("cudaSetDevice", rt.cudaSetDevice(self.ordinal))
        attr = rt.cudaDeviceAttr.cudaDevAttrConcurrentManagedAccess
        concurrent = self._call(
            "cudaDeviceGetAttribute", rt.cudaDeviceGetAttribute(attr, self.ordinal)
        )
        if not concurrent:
            raise MapperError(f"GPU {self.ordinal} lacks concurrent managed access: no prefetch")
        try:
            flags = cc.define(rt, "cudaStreamNonBlocking")
            for _ in range(streams):
                self._streams.append(
                    self._call("cudaStreamCreateWithFlags", rt.cudaStreamCreateWithFlags(flags))
                )
        except BaseException:
            for stream in self._streams:
                rt.cudaStreamDestroy(stream)
            self._streams.clear()
            raise

    # --- helpers --------------------------------------------------------------------------

    def _err(self, call: str, result: Any) -> cc.CudaError:
        return cc.CudaError(
            call, cc.code_of(result), cc.error_name(self._b, result[0], runtime=True)
        )

    def _call(self, name: str, result: Any) -> Any:
        try:
            return cc.check(self._b, name, result, runtime=True)
        except cc.CudaError as e:
            raise MapperError(str(e)) from e

    def _wrap(self, fn: Any, *args: Any) -> None:
        try:
            fn(self._b, *args)
        except cc.CudaError as e:
            raise MapperError(str(e)) from e

    def _allocation(self, address: int, size: int) -> int:
        for base, length in self._allocations.items():
            if base <= address and address + size <= base + length:
                return base
        raise MapperError(f"[{address:#x}, +{size}) is not managed memory of this mapper")

    def _free_bytes(self) -> int:
        free, _total = self._call("cudaMemGetInfo", self._rt.cudaMemGetInfo())
        return int(free)

    def _stream(self, index: int) -> Any:
        if not 0 <= index < len(self._streams):
            raise MapperError(f"stream {index} out of range (0..{len(self._streams) - 1})")
        return self._streams[index]

    def _event_done(self, event: _RtEvent, rt_event: Any) -> None:
        with self._events_lock:
            self._outstanding.discard(event)
        result = self._rt.cudaEventDestroy(rt_event)
        if cc.code_of(result) != cc.CUDA_SUCCESS:
            log.warning(
                "cudaEventDestroy failed: %s", cc.error_name(self._b, result[0], runtime=True)
            )

    def _record(self, stream: Any, what: str, enqueue: Any) -> CopyEvent:
        rt = self._rt
        flags = cc.define(rt, "cudaEventDisableTiming")
        event = self._call("cudaEventCreateWithFlags", rt.cudaEventCreateWithFlags(flags))
        try:
            enqueue()
            self._call("cudaEventRecord", rt.cudaEventRecord(event, stream))
        except BaseException:
            rt.cudaDeviceSynchronize()
            rt.cudaEventDestroy(event)
            raise
        ev = _RtEvent(self, event, what)
        with self._events_lock:
            self._outstanding.add(ev)
        return ev

    # --- Mapper ---------------------------------------------------------------------------

    def granularity_bytes(self) -> int:
        return GRANULARITY_BYTES

    def reserve(self, size_bytes: int) -> Reservation:
        if size_bytes <= 0 or size_bytes % GRANULARITY_BYTES:
            raise MapperError(f"{size_bytes} is not a positive multiple of the 2 MiB granularity")
        rt = self._rt
        with self._lock:
            free = self._free_bytes()
            if size_bytes + self.headroom_bytes > free:
                raise MapperError(
                    f"managed allocation of {size_bytes} bytes refused: GPU {self.ordinal} has "
                    f"{free} free (headroom {self.headroom_bytes})"
                )
            flags = cc.define(rt, "cudaMemAttachGlobal")
            address = int(self._call("cudaMallocManaged", rt.cudaMallocManaged(size_bytes, flags)))
            try:
                advice = rt.cudaMemoryAdvise
                self._wrap(
                    cc.rt_mem_advise,
                    address,
                    size_bytes,
                    advice.cudaMemAdviseSetPreferredLocation,
                    self.ordinal,
                )
                self._wrap(
                    cc.rt_mem_advise,
                    address,
                    size_bytes,
                    advice.cudaMemAdviseSetAccessedBy,
                    self.ordinal,
                )
            except BaseException:
                rt.cudaFree(address)
                raise
            self._allocations[address] = size_bytes
            self._on_device[address] = True
        return Reservation(address, size_bytes)

    def free_reservation(self, reservation: Reservation) -> None:
        with self._lock:
            if self._allocations.get(reservation.address) != reservation.size_bytes:
                raise MapperError(f"no managed allocation {reservation}")
            self.synchronize()
            self._call("cudaFree", self._rt.cudaFree(reservation.address))
            del self._allocations[reservation.address]
            del self._on_device[reservation.address]

    def import_fd(self, fd: int, size_bytes: int) -> Handle:
        os.close(fd)  # the contract: consumed in every case
        raise MapperError(_NO_FDS)

    def export_fd(self, handle: Handle) -> int:
        raise MapperError(_NO_FDS)

    def release(self, handle: Handle) -> None:
        raise MapperError(_NO_FDS)

    def map(self, address: int, size_bytes: int, handle: Handle, offset_bytes: int = 0) -> None:
        raise MapperError(_NO_FDS)

    def unmap(self, address: int, size_bytes: int) -> None:
        raise MapperError(_NO_FDS)

    def set_access(self, address: int, size_bytes: int, *, writable: bool = True) -> None:
        """Managed memory is always accessible; only checks the range is ours."""
        with self._lock:
            self._allocation(address, size_bytes)

    def map_host(self, fd: int, size_bytes: int, *, writable: bool = False) -> HostBuffer:
        try:
            address = _host_files.map_file(fd, size_bytes, writable=writable)
        except OSError as e:
            raise MapperError(f"mmap of host-store fd {fd}: {e}") from e
        flags = 0 if writable else cc.define(self._rt, "cudaHostRegisterReadOnly")
        try:
            self._call("cudaHostRegister", self._rt.cudaHostRegister(address, size_bytes, flags))
        except BaseException:
            _host_files.unmap_file(address, size_bytes)
            raise
        buffer = HostBuffer(address, size_bytes, writable)
        with self._lock:
            self._hosts[address] = buffer
        return buffer

    def unmap_host(self, buffer: HostBuffer) -> None:
        with self._lock:
            if self._hosts.get(buffer.address) != buffer:
                raise MapperError(f"unknown host buffer {buffer}")
            self.synchronize()
            self._call("cudaHostUnregister", self._rt.cudaHostUnregister(buffer.address))
            del self._hosts[buffer.address]
            _host_files.unmap_file(buffer.address, buffer.size_bytes)

    def stream_count(self) -> int:
        return len(self._streams)

    def _copy(self, dst: int, src: int, size: int, stream_index: int, what: str) -> CopyEvent:
        stream = self._stream(stream_index)
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDefault

        def enqueue() -> None:
            for offset in range(0, size, self.chunk_bytes):
                piece = min(self.chunk_bytes, size - offset)
                self._call(
                    "cudaMemcpyAsync",
                    self._rt.cudaMemcpyAsync(dst + offset, src + offset, piece, kind, stream),
                )

        return self._record(stream, what, enqueue)

    def copy_to_device(
        self, dst_address: int, src_address: int, size_bytes: int, stream: int = 0
    ) -> CopyEvent:
        with self._lock:
            self._allocation(dst_address, size_bytes)
            return self._copy(
                dst_address, src_address, size_bytes, stream, "copy to managed memory"
            )

    def copy_to_host(
        self, dst_address: int, src_address: int, size_bytes: int, stream: int = 0
    ) -> CopyEvent:
        with self._lock:
            self._allocation(src_address, size_bytes)
            return self._copy(
                dst_address, src_address, size_bytes, stream, "copy from managed memory"
            )

    # --- the managed swap -----------------------------------------------------------------

    def prefetch_to_host(self, reservation: Reservation, stream: int = 0) -> CopyEvent:
        """Swap-out: prefer the CPU and migrate every page there (frees the HBM)."""
        with self._lock:
            base = self._allocation(reservation.address, reservation.size_bytes)
            rt = self._rt
            advice = rt.cudaMemoryAdvise.cudaMemAdviseSetPreferredLocation
            self._wrap(cc.rt_mem_advise, base, reservation.size_bytes, advice, None)
            s = self._stream(stream)
            event = self._record(
                s, "prefetch to host",
                lambda: self._wrap(cc.rt_prefetch_async, base, reservation.size_bytes, None, s),
            )  # fmt: skip
            self._on_device[base] = False
            return event

    def prefetch_to_device(self, reservation: Reservation, stream: int = 0) -> CopyEvent:
        """Swap-in: prefer the GPU and migrate every page back — only if it fits."""
        with self._lock:
            base = self._allocation(reservation.address, reservation.size_bytes)
            if not self._on_device[base]:
                free = self._free_bytes()
                if reservation.size_bytes + self.headroom_bytes > free:
                    raise MapperError(
                        f"prefetch of {reservation.size_bytes} bytes to GPU {self.ordinal} "
                        f"refused: {free} free (headroom {self.headroom_bytes})"
                    )
            rt = self._rt
            advice = rt.cudaMemoryAdvise.cudaMemAdviseSetPreferredLocation
            self._wrap(cc.rt_mem_advise, base, reservation.size_bytes, advice, self.ordinal)
            s = self._stream(stream)
            size, ordinal = reservation.size_bytes, self.ordinal
            event = self._record(
                s, "prefetch to device",
                lambda: self._wrap(cc.rt_prefetch_async, base, size, ordinal, s),
            )  # fmt: skip
            self._on_device[base] = True
            return event

    def synchronize(self) -> None:
        with self._lock:
            result = self._rt.cudaDeviceSynchronize()
            error = (
                None
                if cc.code_of(result) == cc.CUDA_SUCCESS
                else self._err("cudaDeviceSynchronize", result)
            )
            with self._events_lock:
                events = list(self._outstanding)
            for event in events:
                with event._lock:
                    event._finish(error)
        if error is not None:
            raise CopyError(f"managed copies failed: {error}") from error

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.synchronize()
            except CopyError as e:
                log.warning("closing managed mapper after a failure: %s", e)
            for stream in self._streams:
                result = self._rt.cudaStreamDestroy(stream)
                if cc.code_of(result) != cc.CUDA_SUCCESS:
                    log.warning(
                        "cudaStreamDestroy: %s", cc.error_name(self._b, result[0], runtime=True)
                    )
            self._streams.clear()
