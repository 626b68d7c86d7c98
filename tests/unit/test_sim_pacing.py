"""Pacing of the sim mapper's copies to an emulated link: the schedule, not the stopwatch.

The pacer's clock and sleeper are injected, so these tests check the sleeps it computes
for a byte count and a bandwidth; nothing here is timed.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from typing import cast

import pytest

from modelswap_api.wire import Message, Op, Peer
from modelswap_client._copier import Copier
from modelswap_client._facts import AgentFacts
from modelswap_client._gate import ClientState, StateGate
from modelswap_client._handler import AgentHandler
from modelswap_client._hooks import Hooks
from modelswap_client._kvhost import KvHostTier
from modelswap_client.mappers.base import Mapper, MapperError, get_mapper
from modelswap_client.mappers.sim import Pacer, SimMapper
from modelswap_client.regions import Regions, RegionSpec
from modelswap_sidecar.allocators.sim import SimAllocator

pytestmark = pytest.mark.timeout(30)

MIB = 1 << 20
GB = 1e9
NO_PEER = cast(Peer, None)  # `handle` answers by its return value, never through the peer


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


# -- the node's pace, told at registration ------------------------------------------------


def test_the_agents_pace_reaches_the_mapper_and_paces_a_swap_in() -> None:
    """The registration reply's `paceBytesPerSecond` paces the sim mapper with no model
    code involved, and a restore of N bytes then takes at least N / pace on the clock."""
    clock = FakeClock(advance_on_sleep=True)
    mapper = SimMapper(clock=clock, sleep=clock.sleep)
    gate, facts, hooks = StateGate("m"), AgentFacts(), Hooks()
    regions = Regions(mapper)
    size = 8 * MIB
    regions.reserve([RegionSpec("w", size)])
    handler = AgentHandler(
        "m",
        mapper,
        gate=gate,
        facts=facts,
        regions=regions,
        copier=Copier(mapper, regions, 2 * MIB),  # 4 pieces over 2 streams
        kv_host=KvHostTier(mapper),
        hooks=hooks,
    )
    pace = 0.5 * GB
    chunk = os.memfd_create("chunk")
    copy = os.memfd_create("copy")
    try:
        handler.registered({"epoch": 1})  # no pace said: the mapper keeps its own (none)
        assert mapper.paced_bytes_per_second() == 0.0
        handler.registered({"epoch": 1, "paceBytesPerSecond": pace})
        assert mapper.paced_bytes_per_second() == pace
        os.ftruncate(chunk, size)
        os.ftruncate(copy, size)
        os.pwrite(copy, b"w" * size, 0)
        gate.set(ClientState.SWAPPED_OUT)
        ask = itertools.count(1)
        chunks = [{"offset": 0, "bytes": size, "fd": 0}]
        mapped = handler.handle(
            NO_PEER, Message(Op.MAP, next(ask), 0, {"regions": [{"tag": "w", "chunks": chunks}]},
                             [chunk])
        )  # fmt: skip
        assert mapped.ok, mapped.error_message
        start = clock()
        restored = handler.handle(
            NO_PEER, Message(Op.RESTORE, next(ask), 0,
                             {"regions": [{"tag": "w", "fd": 0, "bytes": size}]}, [os.dup(copy)])
        )  # fmt: skip
        assert restored.ok, restored.error_message
        # the link's time for every byte (to float rounding of the clock's sum)
        assert clock() - start >= size / pace * (1 - 1e-9)
        assert restored.body["copy"]["scaled"] is True
        assert restored.body["copy"]["target_bytes_per_second"] == pace
        assert ctypes.string_at(regions["w"].address, 4) == b"wwww"
    finally:
        os.close(copy)
        handler.release()
        mapper.close()


def test_a_mapper_that_cannot_pace_refuses_by_name() -> None:
    mapper = SimMapper()
    try:
        mapper.pace(0.0)  # the sim mapper: 0 is unpaced
        assert mapper.pacer is None
        with pytest.raises(MapperError, match="must be positive"):
            mapper.pace(-1.0)
        # every other mapper keeps the base's refusal: a real link is not emulated
        with pytest.raises(MapperError, match="cannot pace its copies"):
            Mapper.pace(mapper, 1e9)
    finally:
        mapper.close()
