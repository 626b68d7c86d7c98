from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from modelswap_client.mappers.base import (
    CopyError,
    Handle,
    HostBuffer,
    MapperError,
    Reservation,
    get_mapper,
)
from modelswap_client.mappers.sim import Pacer, SimMapper
from modelswap_sidecar.allocators.base import AllocatorError, Chunk, Location
from modelswap_sidecar.allocators.sim import SimAllocator
from tests.support.allocators import get_allocator

MIB = 1 << 20
GPU = Location.device(0)


@pytest.fixture
def backends() -> Iterator[tuple[SimAllocator, SimMapper]]:
    a = get_allocator("sim", capacities_bytes=[96 * MIB])
    m = get_mapper("sim")
    assert isinstance(a, SimAllocator) and isinstance(m, SimMapper)
    yield a, m
    m.close()
    a.close()


def test_unknown_backends_are_refused_by_name() -> None:
    with pytest.raises(AllocatorError):
        get_allocator("nope")
    with pytest.raises(MapperError):
        get_mapper("nope")


def test_cuda_rules_are_enforced(backends: tuple[SimAllocator, SimMapper]) -> None:
    a, m = backends
    with pytest.raises(AllocatorError):
        a.create(GPU, 3 * MIB)  # not a 2 MiB multiple
    chunk = a.create(GPU, 8 * MIB)
    r = m.reserve(8 * MIB)
    h = m.import_fd(a.export_fd(chunk), 8 * MIB)
    m.map(r.address, 8 * MIB, h)
    with pytest.raises(MapperError):  # no access before set_access
        m.copy_to_device(r.address, r.address, MIB)
    m.set_access(r.address, 8 * MIB)
    ctypes.memset(r.address, 5, 8 * MIB)
    with pytest.raises(MapperError):  # whole mappings only
        m.unmap(r.address, 2 * MIB)
    with pytest.raises(MapperError):
        m.release(h)  # still mapped
    m.unmap(r.address, 8 * MIB)
    m.release(h)
    m.free_reservation(r)
    a.release(chunk)


def test_release_never_hands_an_inode_to_the_next_owner(
    backends: tuple[SimAllocator, SimMapper],
) -> None:
    a, _ = backends
    seen = set()
    for _ in range(6):
        chunk = a.create(GPU, 32 * MIB)
        fd = a.export_fd(chunk)
        ino = os.fstat(fd).st_ino
        os.close(fd)
        assert ino not in seen
        seen.add(ino)
        a.release(chunk)
    assert a.memory_info(GPU).used_bytes == 0


def test_capacity_counter_and_adopt(backends: tuple[SimAllocator, SimMapper]) -> None:
    a, _ = backends
    assert a.wait_pool_full(10)
    chunks = [a.create(GPU, 32 * MIB) for _ in range(3)]
    with pytest.raises(AllocatorError):
        a.create(GPU, 2 * MIB)
    fd = a.export_fd(chunks[0])
    a.release(chunks[0])
    adopted = a.adopt_fd(GPU, fd, 32 * MIB)  # readopt charges capacity again
    os.close(fd)
    info = a.memory_info(GPU)
    assert info.used_bytes == 96 * MIB and info.free_bytes == 0
    assert a.pooled_bytes(GPU) == 0
    for c in [*chunks[1:], adopted]:
        a.release(c)


class _Gate:
    """A pacer's sleep that blocks until opened: holds a copy stream busy on cue."""

    def __init__(self) -> None:
        self.opened = threading.Event()

    def sleep(self, seconds: float) -> None:
        assert self.opened.wait(10), "the test never opened the gate"


@dataclass
class _TwoChunks:
    """A reservation of two 2 MiB chunks, mapped with no access, and a 2 MiB host buffer."""

    reservation: Reservation
    pairs: list[tuple[Chunk, Handle]]
    host: HostBuffer
    src_fd: int

    @classmethod
    def map(cls, a: SimAllocator, m: SimMapper) -> _TwoChunks:
        r = m.reserve(4 * MIB)
        pairs = []
        for i in range(2):
            chunk = a.create(GPU, 2 * MIB)
            h = m.import_fd(a.export_fd(chunk), 2 * MIB)
            m.map(r.address + i * 2 * MIB, 2 * MIB, h)
            pairs.append((chunk, h))
        src_fd = os.memfd_create("modelswap-test-src")
        os.ftruncate(src_fd, 2 * MIB)
        os.pwrite(src_fd, b"\x07" * (2 * MIB), 0)
        return cls(r, pairs, m.map_host(src_fd, 2 * MIB), src_fd)

    def undo(self, a: SimAllocator, m: SimMapper) -> None:
        m.synchronize()
        for i, (chunk, h) in enumerate(self.pairs):
            m.unmap(self.reservation.address + i * 2 * MIB, 2 * MIB)
            m.release(h)
            a.release(chunk)
        m.free_reservation(self.reservation)
        m.unmap_host(self.host)
        os.close(self.src_fd)


def test_a_grant_on_a_stream_opens_the_range_to_that_streams_later_copies_only() -> None:
    gate = _Gate()
    a = get_allocator("sim", capacities_bytes=[96 * MIB])
    m = SimMapper(streams=2, pacer=Pacer(1e9, clock=lambda: 0.0, sleep=gate.sleep))
    assert isinstance(a, SimAllocator)
    two = _TwoChunks.map(a, m)
    host = two.host
    first, second = two.reservation.address, two.reservation.address + 2 * MIB
    try:
        m.set_access(first, 2 * MIB)
        blocker = m.copy_to_device(first, host.address, 2 * MIB, 0)  # holds stream 0
        granted = m.set_access_on_stream(second, 2 * MIB, 0)
        assert not granted.query()  # queued behind the blocker
        with pytest.raises(MapperError, match="not mapped with access"):
            m.copy_to_device(second, host.address, 2 * MIB, 1)  # another stream: not yet
        with pytest.raises(MapperError, match="already being granted on stream 0"):
            m.set_access(second, 2 * MIB)
        copied = m.copy_to_device(second, host.address, 2 * MIB, 0)  # behind the grant
        gate.opened.set()
        for event in (blocker, granted, copied):
            event.wait(10)
        assert ctypes.string_at(second, 2 * MIB) == b"\x07" * (2 * MIB)
        m.copy_to_device(second, host.address, 2 * MIB, 1).wait(10)  # granted: any stream
    finally:
        gate.opened.set()
        two.undo(a, m)
        m.close()
        a.close()


def test_a_copy_queued_behind_a_failed_grant_fails_and_touches_nothing(
    backends: tuple[SimAllocator, SimMapper], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, m = backends
    two = _TwoChunks.map(a, m)
    r, host = two.reservation, two.host
    try:

        def refuse(mapping: object, prot: int) -> None:
            raise OSError(12, "Cannot allocate memory (test)")

        monkeypatch.setattr(SimMapper, "_grant", staticmethod(refuse))
        granted = m.set_access_on_stream(r.address, 2 * MIB, 1)
        copied = m.copy_to_device(r.address, host.address, 2 * MIB, 1)
        with pytest.raises(CopyError, match="Cannot allocate memory"):
            granted.wait(10)
        with pytest.raises(CopyError, match="not mapped with access"):
            copied.wait(10)  # it checked again when it ran: no memmove into PROT_NONE
        with pytest.raises(MapperError, match="not mapped with access"):
            m.copy_to_device(r.address, host.address, 2 * MIB, 0)
        monkeypatch.undo()
        m.set_access(r.address, 2 * MIB)  # nothing left half-granted: a retry works
        m.copy_to_device(r.address, host.address, 2 * MIB, 0).wait(10)
        assert ctypes.string_at(r.address, 2 * MIB) == b"\x07" * (2 * MIB)
    finally:
        two.undo(a, m)
