"""The `sim` allocator: "HBM" is a pool of pre-populated memfd chunks per simulated GPU.

Each sim GPU has a capacity counter. A background thread keeps the pool filled with
chunks of `pool_chunk_bytes` whose pages are already allocated AND zeroed, so a client's
`MAP_POPULATE` mapping of one only builds page tables. `create` takes a pool
chunk (shrunk with `ftruncate` for a smaller request) or, when the pool is behind, makes
one synchronously. `release` closes the memfd for good and the refill thread creates a
fresh one: an inode is never handed to a second model. Invariant per GPU, checked by
`memory_info` and the tests: used bytes + pooled bytes + the chunk the refill thread is
populating (its room is reserved before it starts) <= capacity, except after readopt
overcommits (the memory exists; `free_bytes` is then 0; a chunk being populated then is
closed when it is done, not pooled).
"""

from __future__ import annotations

import collections
import itertools
import logging
import mmap
import os
import resource
import stat
import threading
from collections.abc import Iterable

from modelswap_sidecar.allocators.base import (
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

log = logging.getLogger(__name__)

MIN_POOL_CHUNK_BYTES = 32 * MIB


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _new_chunk_fd(ordinal: int, size_bytes: int) -> int:
    """A memfd of `size_bytes` whose every page is allocated and zeroed (pre-populated)."""
    fd = os.memfd_create(f"modelswap-sim-gpu{ordinal}", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size_bytes)
        os.posix_fallocate(fd, 0, size_bytes)  # allocate every page now (ENOSPC here)
        # fallocate leaves shmem pages "not uptodate": the kernel zeroes each on its first
        # fault. Left alone, that zeroing (~0.4 s/GiB measured here) would land in the
        # client's MAP_POPULATE during a swap-in. One populated read mapping faults every
        # page in once, now, on the pool's background thread.
        with mmap.mmap(
            fd, size_bytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ
        ):
            pass
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Gpu:
    def __init__(self, ordinal: int, capacity_bytes: int) -> None:
        self.ordinal = ordinal
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        #: the chunk the refill thread is populating (0 or `pool_chunk_bytes`): the process
        #: holds its memfd already, so it counts against capacity like a pooled one
        self.populating_bytes = 0
        self.pool: collections.deque[int] = collections.deque()
        self.chunks: dict[ChunkId, tuple[int, Chunk]] = {}
        self.stopped = False


class SimAllocator(Allocator):
    """Options: `capacities_bytes` (one per sim GPU), `pool_chunk_bytes` (>= 32 MiB),
    `prefill` (keep the pool full in the background; False leaves every chunk to `create`),
    `overhead_bytes_per_process` (what `process_overhead_bytes` "measures" for every
    process; None: nothing measured, the engine uses its own estimate).
    """

    name = "sim"

    def __init__(
        self,
        *,
        capacities_bytes: Iterable[int],
        pool_chunk_bytes: int = MIN_POOL_CHUNK_BYTES,
        prefill: bool = True,
        overhead_bytes_per_process: int | None = None,
    ) -> None:
        if pool_chunk_bytes < MIN_POOL_CHUNK_BYTES or pool_chunk_bytes % GRANULARITY_BYTES:
            raise AllocatorError(
                f"pool_chunk_bytes must be a multiple of 2 MiB and at least 32 MiB, "
                f"not {pool_chunk_bytes}"
            )
        raise_fd_limit()
        self.pool_chunk_bytes = pool_chunk_bytes
        self.overhead_bytes_per_process = overhead_bytes_per_process
        self._gpus = [_Gpu(i, c) for i, c in enumerate(capacities_bytes)]
        for gpu in self._gpus:
            if gpu.capacity_bytes <= 0 or gpu.capacity_bytes % GRANULARITY_BYTES:
                raise AllocatorError(f"sim GPU {gpu.ordinal}: bad capacity {gpu.capacity_bytes}")
        self._lock = threading.Condition()
        self._ids = itertools.count(1)
        self._closed = False
        self._threads: list[threading.Thread] = []
        if prefill:
            for gpu in self._gpus:
                t = threading.Thread(
                    target=self._refill, args=(gpu,), name=f"sim-pool-{gpu.ordinal}", daemon=True
                )
                t.start()
                self._threads.append(t)

    # -- helpers -----------------------------------------------------------------------

    def _gpu(self, location: Location) -> _Gpu:
        if location.kind is not LocationKind.DEVICE or not 0 <= location.index < len(self._gpus):
            raise AllocatorError(f"sim allocator has no location {location}")
        return self._gpus[location.index]

    def _pooled_bytes(self, gpu: _Gpu) -> int:
        return len(gpu.pool) * self.pool_chunk_bytes

    def _held_bytes(self, gpu: _Gpu) -> int:
        """Every chunk byte the process holds: used, pooled and being populated."""
        return gpu.used_bytes + self._pooled_bytes(gpu) + gpu.populating_bytes

    def _refill(self, gpu: _Gpu) -> None:
        while True:
            with self._lock:
                while not self._closed and (
                    self._held_bytes(gpu) + self.pool_chunk_bytes > gpu.capacity_bytes
                ):
                    self._lock.wait()
                if self._closed:
                    return
                gpu.populating_bytes = self.pool_chunk_bytes  # its room, reserved
            try:
                fd = _new_chunk_fd(gpu.ordinal, self.pool_chunk_bytes)
            except OSError as e:  # host memory short: try again after the next release
                log.warning("sim GPU %d: cannot populate a pool chunk: %s", gpu.ordinal, e)
                with self._lock:
                    gpu.populating_bytes = 0
                    self._lock.notify_all()
                    self._lock.wait(timeout=1.0)
                continue
            with self._lock:
                gpu.populating_bytes = 0
                if self._closed or self._held_bytes(gpu) + self.pool_chunk_bytes > (
                    gpu.capacity_bytes
                ):
                    os.close(fd)  # a readopt or a create took the room while we populated
                else:
                    gpu.pool.append(fd)
                self._lock.notify_all()

    def wait_pool_full(self, timeout_seconds: float = 30.0) -> bool:
        """Block until every GPU's pool holds all the chunks its free capacity allows and no
        chunk is being populated (so the memfds the process holds are used + pooled)."""
        with self._lock:
            return self._lock.wait_for(
                lambda: all(
                    g.populating_bytes == 0
                    and self._held_bytes(g) + self.pool_chunk_bytes > g.capacity_bytes
                    for g in self._gpus
                ),
                timeout_seconds,
            )

    # -- Allocator ---------------------------------------------------------------------

    def locations(self) -> list[Location]:
        return [Location.device(g.ordinal) for g in self._gpus]

    def granularity_bytes(self, location: Location) -> int:
        self._gpu(location)
        return GRANULARITY_BYTES

    def preferred_chunk_bytes(self, location: Location) -> int:
        self._gpu(location)
        return self.pool_chunk_bytes

    def max_chunk_bytes(self, location: Location) -> int:
        return self._gpu(location).capacity_bytes

    def create(self, location: Location, size_bytes: int) -> Chunk:
        gpu = self._gpu(location)
        if size_bytes <= 0 or size_bytes % GRANULARITY_BYTES:
            raise AllocatorError(f"size {size_bytes} is not a positive multiple of 2 MiB")
        fd = -1
        with self._lock:
            if self._closed:
                raise AllocatorError("allocator is closed")
            free = gpu.capacity_bytes - gpu.used_bytes
            if size_bytes > free:
                raise OutOfDeviceMemory(
                    f"sim GPU {gpu.ordinal}: {size_bytes} bytes requested, {free} free",
                    requested_bytes=size_bytes,
                    free_bytes=free,
                )
            if size_bytes <= self.pool_chunk_bytes and gpu.pool:
                fd = gpu.pool.popleft()
            else:
                # make room: pooled chunks (and one being populated) count against capacity
                while gpu.pool and self._held_bytes(gpu) + size_bytes > gpu.capacity_bytes:
                    os.close(gpu.pool.pop())
            gpu.used_bytes += size_bytes  # charged now, so concurrent creates see it
            chunk = Chunk(ChunkId(next(self._ids)), location, size_bytes)
        try:
            if fd < 0:
                fd = _new_chunk_fd(gpu.ordinal, size_bytes)
            elif size_bytes < self.pool_chunk_bytes:
                os.ftruncate(fd, size_bytes)  # gives the tail's pages back
        except OSError as e:
            with self._lock:
                gpu.used_bytes -= size_bytes
                self._lock.notify_all()
            if fd >= 0:
                os.close(fd)
            raise OutOfDeviceMemory(
                f"sim GPU {gpu.ordinal}: host memory for the chunk: {e}",
                requested_bytes=size_bytes,
                free_bytes=0,
            ) from e
        with self._lock:
            gpu.chunks[chunk.chunk_id] = (fd, chunk)
            self._lock.notify_all()
        return chunk

    def export_fd(self, chunk: Chunk) -> int:
        gpu = self._gpu(chunk.location)
        with self._lock:
            entry = gpu.chunks.get(chunk.chunk_id)
            if entry is None:
                raise AllocatorError(f"chunk {chunk.chunk_id} is not live")
            return os.dup(entry[0])

    def release(self, chunk: Chunk) -> None:
        gpu = self._gpu(chunk.location)
        with self._lock:
            entry = gpu.chunks.pop(chunk.chunk_id, None)
            if entry is None:
                return
            gpu.used_bytes -= entry[1].size_bytes
            self._lock.notify_all()
        os.close(entry[0])

    def adopt_fd(self, location: Location, fd: int, size_bytes: int) -> Chunk:
        gpu = self._gpu(location)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != size_bytes:
            raise AllocatorError(
                f"adopted fd is not a {size_bytes}-byte chunk (size {info.st_size})"
            )
        kept = os.dup(fd)
        with self._lock:
            gpu.used_bytes += size_bytes
            while gpu.pool and self._held_bytes(gpu) > gpu.capacity_bytes:
                os.close(gpu.pool.pop())
            chunk = Chunk(ChunkId(next(self._ids)), location, size_bytes)
            gpu.chunks[chunk.chunk_id] = (kept, chunk)
        return chunk

    def memory_info(self, location: Location) -> MemoryInfo:
        gpu = self._gpu(location)
        with self._lock:
            free = max(gpu.capacity_bytes - gpu.used_bytes, 0)
            return MemoryInfo(location, gpu.capacity_bytes, gpu.used_bytes, free)

    def process_overhead_bytes(
        self,
        location: Location,
        pids: Iterable[int],
        mapped_bytes_by_pid: dict[int, int] | None = None,
    ) -> dict[int, int | None]:
        self._gpu(location)
        return dict.fromkeys(pids, self.overhead_bytes_per_process)

    def pooled_bytes(self, location: Location) -> int:
        """Bytes of pre-populated chunks waiting in the pool (for tests and metrics)."""
        gpu = self._gpu(location)
        with self._lock:
            return self._pooled_bytes(gpu)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        for t in self._threads:
            t.join(timeout=10)
        with self._lock:
            for gpu in self._gpus:
                while gpu.pool:
                    os.close(gpu.pool.pop())
                for fd, _ in gpu.chunks.values():
                    os.close(fd)
                gpu.chunks.clear()
                gpu.used_bytes = 0
