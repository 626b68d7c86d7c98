"""The `sim` mapper: memfd chunks mapped at fixed addresses, copies on worker threads.

It enforces the CUDA rules of `base` (2 MiB granularity, access set after map, whole
mapping unmap only, no unmap with copies in flight) so code tested here is CUDA-shaped.
`map` places a chunk PROT_NONE (an access faults, as before `cuMemSetAccess`);
`set_access` maps it again at the same address with `MAP_SHARED|MAP_FIXED|MAP_POPULATE`
and the granted protection, so a swap-in walks the page tables once.
`set_access_on_stream` does that re-map on a copy stream's thread, outside the mapper's
lock: the copies queued after it on that stream may use the range (they check at run time
that the grant succeeded, as a CUDA stream stops at its first error), other streams only
once it is done. Populating is most of a sim swap-in's grant, so grants of different
chunks then run side by side, each right ahead of its own chunk's copy.
Pacing (`bandwidth_bytes_per_second`) emulates a link slower than this machine's copy
ceiling: every copy, on every stream, books its transfer time on one shared `Pacer`
timeline, so all streams together move at most that many bytes per second (a real link is
shared the same way). Figures measured with it are "scaled" (`paced_bytes_per_second()`),
never real link speeds; a bandwidth at or above the machine's own copy speed paces nothing.
A model does not choose it: the agent's `gpus[].paceGBps` reaches the mapper through the
registration reply (`pace`, called by the client's handler).
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import queue
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from modelswap_client import _libc
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


@dataclass(slots=True)
class _Mapping:
    address: int
    size_bytes: int
    handle_id: int
    access: int  # _libc.PROT_* bits; PROT_NONE until set_access
    fd: int  # the handle's kept fd (lives until `release`, which needs the range unmapped)
    offset_bytes: int
    #: (stream, protection) of a grant queued on a stream and not yet run, else None
    granting: tuple[int, int] | None = None


class _Event(CopyEvent):
    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: BaseException | None = None

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self._done.set()

    def query(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_seconds: float | None = None) -> None:
        if not self._done.wait(timeout_seconds):
            raise TimeoutError("copy still running")
        if self.error is not None:
            raise CopyError(f"copy failed: {self.error}") from self.error


_Job = tuple[Callable[[], None], _Event] | None


def _nothing() -> None:
    return None


class Pacer:
    """One emulated link shared by every copy stream: bytes move at most at
    `bandwidth_bytes_per_second` in aggregate.

    `reserve(n)` books `n` bytes on the link's timeline (from now, or from where the last
    booking ends if that is later) and returns when the transfer may be finished;
    `wait_until(t)` sleeps until then. A copy books when it starts, does its memmove (real
    time that counts towards its slot), then waits out the rest. The clock and sleeper are
    injectable so tests check the schedule without timing anything.
    """

    def __init__(
        self,
        bandwidth_bytes_per_second: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if bandwidth_bytes_per_second <= 0:
            raise MapperError("a pacing bandwidth must be positive")
        self.bandwidth_bytes_per_second = float(bandwidth_bytes_per_second)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._free_at = -math.inf  # when the link's last booking ends

    def reserve(self, size_bytes: int) -> float:
        """Book `size_bytes` on the link; returns the clock time the transfer ends."""
        with self._lock:
            start = max(self._clock(), self._free_at)
            self._free_at = start + size_bytes / self.bandwidth_bytes_per_second
            return self._free_at

    def wait_until(self, deadline: float) -> float:
        """Sleep until `deadline` (clock time); returns the seconds slept (0 if past)."""
        remaining = deadline - self._clock()
        if remaining <= 0:
            return 0.0
        self._sleep(remaining)
        return remaining


class _Stream:
    """An in-order copy queue served by one thread (a CUDA stream's host analogue)."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._pending: set[_Event] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], None]) -> _Event:
        event = _Event()
        with self._lock:
            self._pending.add(event)
        self._queue.put((work, event))
        return event

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            work, event = job
            error: BaseException | None = None
            try:
                work()
            except BaseException as e:
                error = e
            with self._lock:
                self._pending.discard(event)
            event.finish(error)

    def pending(self) -> list[_Event]:
        with self._lock:
            return list(self._pending)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)


class SimMapper(Mapper):
    name = "sim"

    @property
    def on_device(self) -> bool:
        return False  # memfd chunks: host memory standing in for a GPU's

    @property
    def host_accessible(self) -> bool:
        return True

    @property
    def device_ordinal(self) -> int:
        return 0

    def __init__(
        self,
        *,
        streams: int = 2,
        bandwidth_bytes_per_second: float = 0.0,
        pacer: Pacer | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`bandwidth_bytes_per_second` > 0 paces every copy to that emulated link (see
        `Pacer`); `pacer` passes one in; `clock`/`sleep` go to the pacers this mapper makes
        (here or in `pace`), so tests check a schedule without timing it."""
        if streams < 1:
            raise MapperError("streams must be at least 1")
        if bandwidth_bytes_per_second < 0:
            raise MapperError("a pacing bandwidth must be positive (or 0: no pacing)")
        _libc.raise_fd_limit()
        self._clock = clock
        self._sleep = sleep
        if pacer is None and bandwidth_bytes_per_second > 0:
            pacer = Pacer(bandwidth_bytes_per_second, clock=clock, sleep=sleep)
        self.pacer = pacer
        self.bandwidth_bytes_per_second = 0.0 if pacer is None else pacer.bandwidth_bytes_per_second
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._reservations: dict[int, Reservation] = {}
        self._handles: dict[int, tuple[int, int]] = {}  # handle_id → (kept fd, size)
        self._mappings: dict[int, _Mapping] = {}  # address → mapping
        self._starts: list[int] = []  # sorted mapping addresses
        self._host: dict[int, HostBuffer] = {}
        self._streams = [_Stream(f"modelswap-copy-{i}") for i in range(streams)]

    # -- address space ---------------------------------------------------------------

    def granularity_bytes(self) -> int:
        return GRANULARITY_BYTES

    def _aligned(self, *values: int) -> None:
        for value in values:
            if value % GRANULARITY_BYTES:
                raise MapperError(f"{value:#x} is not a multiple of {GRANULARITY_BYTES} bytes")

    def reserve(self, size_bytes: int) -> Reservation:
        self._aligned(size_bytes)
        if size_bytes <= 0:
            raise MapperError("cannot reserve zero bytes")
        span = size_bytes + GRANULARITY_BYTES
        flags = _libc.MAP_PRIVATE | _libc.MAP_ANONYMOUS | _libc.MAP_NORESERVE
        try:
            raw = _libc.mmap(0, span, _libc.PROT_NONE, flags)
        except OSError as e:
            raise MapperError(f"reserve of {size_bytes} bytes failed: {e}") from e
        start = -(-raw // GRANULARITY_BYTES) * GRANULARITY_BYTES
        if start > raw:
            _libc.munmap(raw, start - raw)
        tail = raw + span - (start + size_bytes)
        if tail:
            _libc.munmap(start + size_bytes, tail)
        reservation = Reservation(start, size_bytes)
        with self._lock:
            self._reservations[start] = reservation
        return reservation

    def free_reservation(self, reservation: Reservation) -> None:
        with self._lock:
            if self._reservations.get(reservation.address) != reservation:
                raise MapperError(f"no reservation at {reservation.address:#x}")
            if self._overlapping(reservation.address, reservation.size_bytes):
                raise MapperError("reservation still has mappings; unmap them first")
            del self._reservations[reservation.address]
        _libc.munmap(reservation.address, reservation.size_bytes)

    def _reservation_of(self, address: int, size_bytes: int) -> Reservation:
        for r in self._reservations.values():
            if r.address <= address and address + size_bytes <= r.address + r.size_bytes:
                return r
        raise MapperError(f"[{address:#x}, +{size_bytes}) is not inside one reservation")

    def _overlapping(self, address: int, size_bytes: int) -> list[_Mapping]:
        end = address + size_bytes
        i = bisect.bisect_right(self._starts, address) - 1
        found = []
        for start in self._starts[max(i, 0) :]:
            if start >= end:
                break
            m = self._mappings[start]
            if m.address + m.size_bytes > address:
                found.append(m)
        return found

    # -- handles ---------------------------------------------------------------------

    def import_fd(self, fd: int, size_bytes: int) -> Handle:
        try:
            self._aligned(size_bytes)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size < size_bytes:
                raise MapperError(f"fd {fd} is not a chunk of at least {size_bytes} bytes")
            kept = os.dup(fd)  # the readopt dup; it is the handle, as a CUDA handle would be
        finally:
            os.close(fd)
        handle = Handle(next(self._ids), size_bytes)
        with self._lock:
            self._handles[handle.handle_id] = (kept, size_bytes)
        return handle

    def export_fd(self, handle: Handle) -> int:
        with self._lock:
            kept, _ = self._require_handle(handle)
            return os.dup(kept)

    def _require_handle(self, handle: Handle) -> tuple[int, int]:
        entry = self._handles.get(handle.handle_id)
        if entry is None:
            raise MapperError(f"unknown or released handle {handle.handle_id}")
        return entry

    def release(self, handle: Handle) -> None:
        with self._lock:
            kept, _ = self._require_handle(handle)
            if any(m.handle_id == handle.handle_id for m in self._mappings.values()):
                raise MapperError(f"handle {handle.handle_id} is still mapped")
            del self._handles[handle.handle_id]
        os.close(kept)

    # -- mapping ---------------------------------------------------------------------

    def map(self, address: int, size_bytes: int, handle: Handle, offset_bytes: int = 0) -> None:
        self._aligned(address, size_bytes, offset_bytes)
        with self._lock:
            kept, chunk_bytes = self._require_handle(handle)
            if offset_bytes + size_bytes > chunk_bytes or size_bytes <= 0:
                raise MapperError("mapping exceeds the chunk")
            self._reservation_of(address, size_bytes)
            if self._overlapping(address, size_bytes):
                raise MapperError(f"[{address:#x}, +{size_bytes}) is already mapped")
            # CUDA maps without access until cuMemSetAccess; so do we: the chunk is in the
            # process's maps, PROT_NONE, and an access faults. Populating happens when
            # access is granted (one page-table walk, not map + revoke + grant).
            try:
                _libc.mmap(
                    address,
                    size_bytes,
                    _libc.PROT_NONE,
                    _libc.MAP_SHARED | _libc.MAP_FIXED,
                    kept,
                    offset_bytes,
                )
            except OSError as e:
                self._cover(address, size_bytes)
                raise MapperError(f"map at {address:#x} failed: {e}") from e
            self._mappings[address] = _Mapping(
                address, size_bytes, handle.handle_id, 0, kept, offset_bytes
            )
            bisect.insort(self._starts, address)

    def _covering(self, address: int, size_bytes: int) -> list[_Mapping]:
        """The mappings that make up exactly [address, +size_bytes), in order, none of them
        with a grant still queued. Called with the lock held."""
        covered = sorted(self._overlapping(address, size_bytes), key=lambda m: m.address)
        cursor = address
        for m in covered:
            if m.address != cursor:
                break
            cursor = m.address + m.size_bytes
        if not covered or cursor != address + size_bytes:
            raise MapperError("set_access must cover whole, contiguous mappings")
        for m in covered:
            if m.granting is not None:
                raise MapperError(
                    f"access to the mapping at {m.address:#x} is already being granted "
                    f"on stream {m.granting[0]}"
                )
        return covered

    @staticmethod
    def _grant(m: _Mapping, prot: int) -> None:
        if m.access == _libc.PROT_NONE:
            # first access: map the chunk again in place, populated, so copies never fault
            # (the pool's chunks are zeroed already: this only builds page tables)
            flags = _libc.MAP_SHARED | _libc.MAP_FIXED | _libc.MAP_POPULATE
            _libc.mmap(m.address, m.size_bytes, prot, flags, m.fd, m.offset_bytes)
        else:
            _libc.mprotect(m.address, m.size_bytes, prot)

    def set_access(self, address: int, size_bytes: int, *, writable: bool = True) -> None:
        self._aligned(address, size_bytes)
        prot = _libc.PROT_READ | (_libc.PROT_WRITE if writable else 0)
        with self._lock:
            for m in self._covering(address, size_bytes):
                if m.access != prot:
                    self._grant(m, prot)
                    m.access = prot

    def set_access_on_stream(
        self, address: int, size_bytes: int, stream: int = 0, *, writable: bool = True
    ) -> CopyEvent:
        self._aligned(address, size_bytes)
        prot = _libc.PROT_READ | (_libc.PROT_WRITE if writable else 0)
        index = stream % len(self._streams)
        with self._lock:
            todo = [m for m in self._covering(address, size_bytes) if m.access != prot]
            for m in todo:
                m.granting = (index, prot)
        if not todo:
            done = _Event()
            done.finish()
            return done

        def work() -> None:
            try:
                for m in todo:
                    self._grant(m, prot)  # outside the lock: other streams go on meanwhile
                    with self._lock:
                        m.access = prot
            finally:
                with self._lock:
                    for m in todo:
                        m.granting = None

        return self._streams[index].submit(work)

    def _cover(self, address: int, size_bytes: int) -> None:
        flags = _libc.MAP_PRIVATE | _libc.MAP_ANONYMOUS | _libc.MAP_FIXED | _libc.MAP_NORESERVE
        _libc.mmap(address, size_bytes, _libc.PROT_NONE, flags)

    def unmap(self, address: int, size_bytes: int) -> None:
        with self._lock:
            m = self._mappings.get(address)
            if m is None or m.size_bytes != size_bytes:
                raise MapperError(
                    f"unmap [{address:#x}, +{size_bytes}) is not exactly one whole mapping"
                )
            busy = [e for s in self._streams for e in s.pending()]
            if busy:
                raise MapperError("copies are in flight; synchronize() before unmap")
            self._cover(address, size_bytes)
            del self._mappings[address]
            self._starts.remove(address)

    def mapped_ranges(self) -> list[tuple[int, int]]:
        """(address, size) of every live mapping; for tests and diagnostics."""
        with self._lock:
            return [(m.address, m.size_bytes) for m in self._mappings.values()]

    # -- host buffers and copies -------------------------------------------------------

    def map_host(self, fd: int, size_bytes: int, *, writable: bool = False) -> HostBuffer:
        prot = _libc.PROT_READ | (_libc.PROT_WRITE if writable else 0)
        try:
            address = _libc.mmap(0, size_bytes, prot, _libc.MAP_SHARED | _libc.MAP_POPULATE, fd)
        except OSError as e:
            raise MapperError(f"map_host of fd {fd} failed: {e}") from e
        buffer = HostBuffer(address, size_bytes, writable)
        with self._lock:
            self._host[address] = buffer
        return buffer

    def unmap_host(self, buffer: HostBuffer) -> None:
        with self._lock:
            if self._host.pop(buffer.address, None) is None:
                raise MapperError(f"no host buffer at {buffer.address:#x}")
        _libc.munmap(buffer.address, buffer.size_bytes)

    def _check_device(
        self, address: int, size_bytes: int, prot: int, stream: int | None = None
    ) -> bool:
        """Raise unless [address, +size_bytes) is mapped with `prot`, or (for a copy on
        `stream`) is being granted it on that same stream ahead of the copy. True when
        some of it is still being granted: the copy must check again when it runs."""
        pending = False
        with self._lock:
            ms = sorted(self._overlapping(address, size_bytes), key=lambda m: m.address)
            cursor = address
            for m in ms:
                if m.address > cursor:
                    break
                if m.access & prot != prot:
                    queued = m.granting  # (stream, prot) of a grant ahead on a stream
                    if queued is None or queued[0] != stream or queued[1] & prot != prot:
                        break
                    pending = True
                cursor = m.address + m.size_bytes
            if cursor < address + size_bytes:
                raise MapperError(
                    f"device range [{address:#x}, +{size_bytes}) is not mapped with access"
                )
        return pending

    def _check_host(self, address: int, size_bytes: int, writable: bool) -> None:
        with self._lock:
            for b in self._host.values():
                if b.address <= address and address + size_bytes <= b.address + b.size_bytes:
                    if writable and not b.writable:
                        raise MapperError("host buffer is read-only")
                    return
        raise MapperError(f"host range [{address:#x}, +{size_bytes}) is not a host buffer")

    def stream_count(self) -> int:
        return len(self._streams)

    def paced_bytes_per_second(self) -> float:
        return self.bandwidth_bytes_per_second

    def pace(self, bandwidth_bytes_per_second: float) -> None:
        """From now on pace every copy to this link (0: unpaced). Copies already queued
        keep the pacer they were submitted with; the same bandwidth keeps the pacer (and
        its booked timeline, and a test's injected clock)."""
        if bandwidth_bytes_per_second < 0:
            raise MapperError("a pacing bandwidth must be positive (or 0: no pacing)")
        if bandwidth_bytes_per_second == self.bandwidth_bytes_per_second:
            return
        self.pacer = (
            Pacer(bandwidth_bytes_per_second, clock=self._clock, sleep=self._sleep)
            if bandwidth_bytes_per_second > 0
            else None
        )
        self.bandwidth_bytes_per_second = float(bandwidth_bytes_per_second)

    def _submit(
        self, stream: int, dst: int, src: int, size_bytes: int, recheck: Callable[[], object]
    ) -> CopyEvent:
        pacer = self.pacer

        def work() -> None:
            recheck()  # a grant queued ahead of this copy may have failed: never fault
            # booked when the copy starts (a stream runs its copies in order), so the
            # memmove's own time counts towards the slot
            deadline = pacer.reserve(size_bytes) if pacer is not None else 0.0
            _libc.memmove(dst, src, size_bytes)
            if pacer is not None:
                pacer.wait_until(deadline)

        return self._streams[stream % len(self._streams)].submit(work)

    def _device_check(
        self, address: int, size_bytes: int, prot: int, stream: int
    ) -> Callable[[], object]:
        """Check the device side now; what the copy calls when it runs (a second check
        where a grant on its stream was still queued, else nothing)."""
        index = stream % len(self._streams)
        if self._check_device(address, size_bytes, prot, index):
            return lambda: self._check_device(address, size_bytes, prot)
        return _nothing

    def copy_to_device(
        self, dst_address: int, src_address: int, size_bytes: int, stream: int = 0
    ) -> CopyEvent:
        rw = _libc.PROT_READ | _libc.PROT_WRITE
        recheck = self._device_check(dst_address, size_bytes, rw, stream)
        self._check_host(src_address, size_bytes, writable=False)
        return self._submit(stream, dst_address, src_address, size_bytes, recheck)

    def copy_to_host(
        self, dst_address: int, src_address: int, size_bytes: int, stream: int = 0
    ) -> CopyEvent:
        recheck = self._device_check(src_address, size_bytes, _libc.PROT_READ, stream)
        self._check_host(dst_address, size_bytes, writable=True)
        return self._submit(stream, dst_address, src_address, size_bytes, recheck)

    def synchronize(self) -> None:
        errors = []
        for s in self._streams:
            for event in s.pending():
                try:
                    event.wait()
                except CopyError as e:
                    errors.append(e)
        if errors:
            raise errors[0]

    def close(self) -> None:
        for s in self._streams:
            s.stop()
