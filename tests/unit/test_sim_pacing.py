"""Pacing of the sim mapper's copies to an emulated link: the schedule, not the stopwatch.

The pacer's clock and sleeper are injected, so these tests check the sleeps it computes
for a byte count and a bandwidth; nothing here is timed.
"""

from __future__ import annotations

import ctypes
import os
import threading

import pytest

from modelswap_client.mappers.base import MapperError, get_mapper
from modelswap_client.mappers.sim import Pacer, SimMapper
from modelswap_sidecar.allocators.sim import SimAllocator

pytestmark = pytest.mark.timeout(30)

MIB = 1 << 20
GB = 1e9


class FakeClock:
    """A clock that moves only when told (or when the pacer sleeps, if `advance_on_sleep`)."""

    def __init__(self, now: float = 100.0, *, advance_on_sleep: bool = False) -> None:
        self.now = now
        self.sleeps: list[float] = []
        self.advance_on_sleep = advance_on_sleep
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            if self.advance_on_sleep:
                self.now += seconds


def test_back_to_back_copies_are_spaced_at_the_bandwidth() -> None:
    clock = FakeClock()
    pacer = Pacer(2 * GB, clock=clock, sleep=clock.sleep)
    # three 1 GB copies booked at once on a 2 GB/s link end 0.5 s apart
    ends = [pacer.reserve(int(GB)) for _ in range(3)]
    assert ends == pytest.approx([100.5, 101.0, 101.5])
    for end in ends:
        pacer.wait_until(end)
    assert clock.sleeps == pytest.approx([0.5, 1.0, 1.5])
    # whatever the streams, the last byte lands no sooner than total bytes / bandwidth
    assert max(clock.sleeps) == pytest.approx(3 * GB / (2 * GB))


def test_the_copy_itself_counts_towards_its_slot() -> None:
    clock = FakeClock(advance_on_sleep=True)
    pacer = Pacer(2 * GB, clock=clock, sleep=clock.sleep)
    end = pacer.reserve(int(GB))  # 0.5 s on the link
    clock.now += 0.2  # the memmove took 0.2 s
    assert pacer.wait_until(end) == pytest.approx(0.3)
    assert clock.sleeps == pytest.approx([0.3])
    # a copy slower than the link is not slowed further
    end = pacer.reserve(int(GB))
    clock.now += 0.7
    assert pacer.wait_until(end) == 0.0
    assert clock.sleeps == pytest.approx([0.3])


def test_an_idle_link_banks_no_credit() -> None:
    clock = FakeClock(advance_on_sleep=True)
    pacer = Pacer(1 * GB, clock=clock, sleep=clock.sleep)
    pacer.wait_until(pacer.reserve(int(GB)))
    clock.now += 10.0  # nothing copied for 10 s
    # the next 2 GB still take 2 s: idle time is not spent as a burst
    assert pacer.reserve(2 * int(GB)) == pytest.approx(clock.now + 2.0)


def test_pacing_bandwidth_must_be_positive() -> None:
    with pytest.raises(MapperError):
        Pacer(0)
    with pytest.raises(MapperError):
        SimMapper(bandwidth_bytes_per_second=-1)
    plain = get_mapper("sim")
    paced = get_mapper("sim", bandwidth_bytes_per_second=2 * GB)
    try:
        assert plain.paced_bytes_per_second() == 0.0
        assert paced.paced_bytes_per_second() == 2 * GB
    finally:
        plain.close()
        paced.close()


def test_streams_share_one_link() -> None:
    """Copies on two streams book one timeline: their aggregate rate is the bandwidth,
    not twice it, and every byte still arrives."""
    clock = FakeClock()  # frozen: every sleep is measured from the same instant
    bandwidth = 1 * GB
    allocator = SimAllocator(capacities_bytes=[32 * MIB], pool_chunk_bytes=32 * MIB)
    mapper = SimMapper(streams=2, pacer=Pacer(bandwidth, clock=clock, sleep=clock.sleep))
    chunk = allocator.create(allocator.locations()[0], 32 * MIB)
    src_fd = os.memfd_create("src")
    try:
        os.ftruncate(src_fd, 32 * MIB)
        host = mapper.map_host(src_fd, 32 * MIB, writable=True)
        data = os.urandom(32 * MIB)
        ctypes.memmove(host.address, data, len(data))
        reservation = mapper.reserve(32 * MIB)
        handle = mapper.import_fd(allocator.export_fd(chunk), 32 * MIB)
        mapper.map(reservation.address, 32 * MIB, handle)
        mapper.set_access(reservation.address, 32 * MIB)
        piece = 4 * MIB
        events = [
            mapper.copy_to_device(
                reservation.address + off, host.address + off, piece, stream=n % 2
            )
            for n, off in enumerate(range(0, 32 * MIB, piece))
        ]
        for ev in events:
            ev.wait(10)
        assert ctypes.string_at(reservation.address, 32 * MIB) == data
        # 8 pieces on one link: each ends one piece-time after the previous, whichever
        # stream carried it
        expected = [k * piece / bandwidth for k in range(1, 9)]
        assert sorted(clock.sleeps) == pytest.approx(expected)
        mapper.unmap(reservation.address, 32 * MIB)
        mapper.release(handle)
        mapper.free_reservation(reservation)
        mapper.unmap_host(host)
    finally:
        os.close(src_fd)
        mapper.close()
        allocator.release(chunk)
        allocator.close()
