from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator

import pytest

from modelswap_client.mappers.base import MapperError, get_mapper
from modelswap_client.mappers.sim import SimMapper
from modelswap_sidecar.allocators.base import AllocatorError, Location, get_allocator
from modelswap_sidecar.allocators.sim import SimAllocator

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
