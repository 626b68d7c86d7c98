"""A swap cycle driven through the two interfaces, the way the engine and client library do.

Agent side: create chunks, export fds, release. Client side: reserve once, import (the
fd is consumed), map at the chunk offsets, set access over the region, pin the host file,
copy, synchronize, unmap, release. Every resource is tracked as soon as the call that made
it returns, so `teardown()` undoes exactly what exists — which is how a failure at any
single call is rolled back in the tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from modelswap_client.mappers.base import Handle, HostBuffer, Mapper, Reservation
from modelswap_sidecar.allocators.base import Allocator, Chunk, Location


@dataclass
class SwapCycle:
    allocator: Allocator
    mapper: Mapper
    size_bytes: int
    chunk_bytes: int
    location: Location = field(default_factory=lambda: Location.device(0))
    reservation: Reservation | None = None
    chunks: list[Chunk] = field(default_factory=list)
    handles: list[tuple[int, Handle]] = field(default_factory=list)  # (offset, handle)
    mapped: list[tuple[int, int, Handle]] = field(default_factory=list)  # (address, size, h)
    hosts: list[HostBuffer] = field(default_factory=list)

    def reserve(self) -> int:
        self.reservation = self.mapper.reserve(self.size_bytes)
        return self.reservation.address

    def swap_in(self, host_fd: int | None) -> None:
        """Allocate → export → import → map → set access → copy the host bytes in."""
        assert self.reservation is not None
        base = self.reservation.address
        for offset in range(0, self.size_bytes, self.chunk_bytes):
            size = min(self.chunk_bytes, self.size_bytes - offset)
            chunk = self.allocator.create(self.location, size)
            self.chunks.append(chunk)
            fd = self.allocator.export_fd(chunk)
            handle = self.mapper.import_fd(fd, size)  # consumes fd
            self.handles.append((offset, handle))
            self.mapper.map(base + offset, size, handle)
            self.mapped.append((base + offset, size, handle))
        self.mapper.set_access(base, self.size_bytes, writable=True)
        if host_fd is not None:
            self.copy(host_fd, to_device=True)

    def copy(self, host_fd: int, *, to_device: bool) -> None:
        assert self.reservation is not None
        host = self.mapper.map_host(host_fd, self.size_bytes, writable=not to_device)
        self.hosts.append(host)
        base = self.reservation.address
        events = []
        step = self.chunk_bytes
        for n, offset in enumerate(range(0, self.size_bytes, step)):
            size = min(step, self.size_bytes - offset)
            stream = n % self.mapper.stream_count()
            if to_device:
                events.append(
                    self.mapper.copy_to_device(base + offset, host.address + offset, size, stream)
                )
            else:
                events.append(
                    self.mapper.copy_to_host(host.address + offset, base + offset, size, stream)
                )
        for event in events:
            event.wait(timeout_seconds=10.0)
        self.mapper.synchronize()
        self.mapper.unmap_host(host)
        self.hosts.remove(host)

    def swap_out(self) -> None:
        """Synchronize → unmap every mapping → release on both sides."""
        self.mapper.synchronize()
        for address, size, handle in list(self.mapped):
            self.mapper.unmap(address, size)
            self.mapped.remove((address, size, handle))
        for offset, handle in list(self.handles):
            self.mapper.release(handle)
            self.handles.remove((offset, handle))
        for chunk in list(self.chunks):
            self.allocator.release(chunk)
            self.chunks.remove(chunk)

    def teardown(self) -> None:
        """Undo whatever exists, then close both backends (idempotent)."""
        for host in list(self.hosts):
            self.mapper.unmap_host(host)
            self.hosts.remove(host)
        self.swap_out()
        if self.reservation is not None:
            self.mapper.free_reservation(self.reservation)
            self.reservation = None
        self.mapper.close()
        self.allocator.close()


def host_file(data: bytes) -> int:
    """A memory-backed host-store-like file holding `data`, as a read-only fd (the mode
    clients get for a weight copy)."""
    fd = os.memfd_create("host-store", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(fd)


def staging_file(size: int) -> int:
    """A zeroed, writable memory-backed staging file (the one-time save's target)."""
    fd = os.memfd_create("staging", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


def read_back(fd: int, size: int) -> bytes:
    return os.pread(fd, size, 0)
