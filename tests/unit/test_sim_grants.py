"""The sim mapper's grants on a copy stream (`grant_on_stream`): the protection is set at
once and the page-table walk runs on the stream; copies queued after a grant wait for its
walk on any stream, a failed walk fails them and `synchronize()`, and nothing unmaps or
re-grants under a walk in flight."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator

import pytest

from modelswap_client import _libc
from modelswap_client.mappers.base import CopyError, HostBuffer, MapperError
from modelswap_client.mappers.sim import SimMapper, _Mapping

MIB = 1 << 20


class GatedSim(SimMapper):
    """A sim mapper whose page-table walks wait for `gate` and log what ran, in order; with
    `fail` set a walk raises instead."""

    def __init__(self) -> None:
        super().__init__(streams=2)
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False
        self.log: list[str] = []

    def _populate(self, m: _Mapping) -> None:
        assert self.gate.wait(10), "test gate never opened"
        if self.fail:
            raise OSError(12, "populate refused (test)")
        super()._populate(m)
        self.log.append(f"grant {m.address:#x}")


@pytest.fixture
def sim() -> Iterator[GatedSim]:
    m = GatedSim()
    yield m
    m.gate.set()
    m.close()


@pytest.fixture
def chunk(sim: GatedSim) -> Iterator[tuple[int, HostBuffer]]:
    """A 4 MiB mapping with no access yet, and a host buffer of 'h' bytes to copy from."""
    r = sim.reserve(4 * MIB)
    dev = os.memfd_create("modelswap-test-chunk")
    os.ftruncate(dev, 4 * MIB)
    handle = sim.import_fd(dev, 4 * MIB)
    sim.map(r.address, 4 * MIB, handle)
    src = os.memfd_create("modelswap-test-host")
    os.pwrite(src, b"h" * (4 * MIB), 0)
    host = sim.map_host(src, 4 * MIB)
    os.close(src)
    yield r.address, host
    sim.gate.set()
    with contextlib.suppress(CopyError):
        sim.synchronize()
    sim.unmap(r.address, 4 * MIB)
    sim.release(handle)
    sim.unmap_host(host)
    sim.free_reservation(r)


def logged_memmove(sim: GatedSim, monkeypatch: pytest.MonkeyPatch) -> None:
    """Log every copy; one that would run before any grant is logged and not made (it
    would fault on the PROT_NONE mapping)."""
    real = _libc.memmove

    def memmove(dst: int, src: int, length: int) -> None:
        if not any(line.startswith("grant") for line in sim.log):
            sim.log.append("copy before its grant")
            return
        real(dst, src, length)
        sim.log.append("copy")

    monkeypatch.setattr(_libc, "memmove", memmove)


def test_a_copy_on_another_stream_waits_for_the_grant(
    sim: GatedSim, chunk: tuple[int, HostBuffer], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, host = chunk
    logged_memmove(sim, monkeypatch)
    sim.gate.clear()
    sim.grant_on_stream(address, 4 * MIB, 0)
    copy = sim.copy_to_device(address, host.address, 4 * MIB, stream=1)  # passes the checks
    assert not copy.query()
    sim.gate.set()
    copy.wait(10)
    assert sim.log == [f"grant {address:#x}", "copy"]
    assert ctypes.string_at(address, 4 * MIB) == b"h" * (4 * MIB)


def test_granting_what_is_granted_queues_nothing(
    sim: GatedSim, chunk: tuple[int, HostBuffer]
) -> None:
    address, _ = chunk
    sim.grant_on_stream(address, 4 * MIB, 0)
    sim.synchronize()
    sim.grant_on_stream(address, 4 * MIB, 1)
    sim.set_access(address, 4 * MIB)
    assert sim.log == [f"grant {address:#x}"]


def test_a_failed_walk_fails_the_copies_queued_behind_it_and_synchronize(
    sim: GatedSim, chunk: tuple[int, HostBuffer]
) -> None:
    address, host = chunk
    sim.fail = True
    sim.grant_on_stream(address, 4 * MIB, 0)
    copy = sim.copy_to_device(address, host.address, 4 * MIB, stream=1)
    with pytest.raises(CopyError, match="populate refused"):
        copy.wait(10)
    with pytest.raises(CopyError):
        sim.synchronize()
    assert sim.log == []
    # the protection was set before the walk: a later copy faults its pages in itself
    sim.copy_to_device(address, host.address, 4 * MIB).wait(10)
    assert ctypes.string_at(address, 4 * MIB) == b"h" * (4 * MIB)


def test_nothing_unmaps_or_regrants_under_a_grant_in_flight(
    sim: GatedSim, chunk: tuple[int, HostBuffer]
) -> None:
    address, _ = chunk
    sim.gate.clear()
    sim.grant_on_stream(address, 4 * MIB, 0, writable=False)
    with pytest.raises(MapperError, match="in flight"):
        sim.unmap(address, 4 * MIB)
    regrant = threading.Thread(target=sim.set_access, args=(address, 4 * MIB))
    regrant.start()  # waits for the read-only grant's walk, then makes it writable
    regrant.join(0.05)
    assert regrant.is_alive() and sim.log == []
    sim.gate.set()
    regrant.join(10)
    assert not regrant.is_alive()
    assert sim.log == [f"grant {address:#x}"]  # walked once: the pages stay mapped
    ctypes.memset(address, 1, 4 * MIB)  # writable now


def test_a_failed_grant_with_no_copy_after_it_is_reported_once_by_synchronize(
    sim: GatedSim, chunk: tuple[int, HostBuffer]
) -> None:
    address, _ = chunk
    sim.fail = True
    sim.grant_on_stream(address, 4 * MIB, 1)
    with pytest.raises(CopyError, match="populate refused"):
        sim.synchronize()
    sim.synchronize()  # reported, then cleared


def test_populate_walks_a_range_in_steps_and_falls_back_to_reading_each_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    size = 4 * MIB
    address = _libc.mmap(
        0, size, _libc.PROT_READ | _libc.PROT_WRITE, _libc.MAP_PRIVATE | _libc.MAP_ANONYMOUS
    )
    try:
        _libc.populate(address, size)  # this kernel's madvise
        calls: list[int] = []

        def old_kernel(addr: int, length: int, advice: int) -> int:
            calls.append(advice)
            ctypes.set_errno(22)  # EINVAL: no MADV_POPULATE_READ before Linux 5.14
            return -1

        monkeypatch.setattr(_libc, "_madvise", old_kernel)
        _libc.populate(address, size)  # reads every page instead
        assert calls == [_libc.MADV_POPULATE_READ]

        def broken(addr: int, length: int, advice: int) -> int:
            ctypes.set_errno(14)  # EFAULT: a real failure is not papered over
            return -1

        monkeypatch.setattr(_libc, "_madvise", broken)
        with pytest.raises(OSError, match="POPULATE_READ"):
            _libc.populate(address, size)
    finally:
        _libc.munmap(address, size)
