"""The sim mapper's grants on a copy stream (`grant_on_stream`): copies queued after a
grant wait for it on any stream, a failed grant fails them and `synchronize()` and leaves
the mapping without access, and nothing unmaps or re-grants under a grant in flight."""

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
    """A sim mapper whose grants wait for `gate` and log what ran, in order; with `fail`
    set a grant raises instead of mapping."""

    def __init__(self) -> None:
        super().__init__(streams=2)
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False
        self.log: list[str] = []

    def _apply_access(self, m: _Mapping, old: int, prot: int) -> None:  # type: ignore[override]
        assert self.gate.wait(10), "test gate never opened"
        if self.fail:
            raise OSError(12, "populate refused (test)")
        SimMapper._apply_access(m, old, prot)
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


def test_a_failed_grant_fails_its_copies_and_synchronize_and_leaves_no_access(
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
    with pytest.raises(MapperError, match="not mapped with access"):
        sim.copy_to_device(address, host.address, 4 * MIB)
    sim.fail = False
    sim.set_access(address, 4 * MIB)  # the grant can be made again
    assert sim.log == [f"grant {address:#x}"]


def test_nothing_unmaps_or_regrants_under_a_grant_in_flight(
    sim: GatedSim, chunk: tuple[int, HostBuffer]
) -> None:
    address, _ = chunk
    sim.gate.clear()
    sim.grant_on_stream(address, 4 * MIB, 0, writable=False)
    with pytest.raises(MapperError, match="in flight"):
        sim.unmap(address, 4 * MIB)
    regrant = threading.Thread(target=sim.set_access, args=(address, 4 * MIB))
    regrant.start()  # waits for the read-only grant, then makes it writable
    regrant.join(0.05)
    assert regrant.is_alive() and sim.log == []
    sim.gate.set()
    regrant.join(10)
    assert sim.log == [f"grant {address:#x}", f"grant {address:#x}"]
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
