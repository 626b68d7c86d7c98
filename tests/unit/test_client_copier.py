"""The client's regions and copier against a sim mapper and memfds, with no agent: chunks
mapped at the regions' addresses, weight and KV copies restored and saved byte for byte,
and every failure leaving nothing mapped and no fd open."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator

import pytest

from modelswap_api.wire import ErrorCode, Message, Op, RegionKind
from modelswap_client._copier import Copier
from modelswap_client.errors import ClientError
from modelswap_client.mappers.base import CopyEvent, Handle, HostBuffer, Mapper, MapperError
from modelswap_client.mappers.sim import SimMapper
from modelswap_client.regions import Regions, RegionSpec

MIB = 1 << 20


class CountingSim(SimMapper):
    """A sim mapper that counts host mappings and can fail its n-th chunk export."""

    def __init__(self) -> None:
        super().__init__(streams=2)
        self.host_maps = 0
        self.fail_export_at: int | None = None
        self.exports = 0
        #: "queued": every grant reads as still queued when it returns (what a sim grant
        #: usually is); "at once": granted synchronously, as CUDA's cuMemSetAccess is
        self.grants_read_as = ""
        self.grant_streams: dict[int, int] = {}  # chunk address → its grant's stream
        self.copy_streams: dict[int, int] = {}  # piece address → its copy's stream

    def map_host(self, fd: int, size_bytes: int, *, writable: bool = False) -> HostBuffer:
        self.host_maps += 1
        return super().map_host(fd, size_bytes, writable=writable)

    def set_access_on_stream(
        self, address: int, size_bytes: int, stream: int = 0, *, writable: bool = True
    ) -> CopyEvent:
        self.grant_streams[address] = stream
        if self.grants_read_as == "at once":
            return Mapper.set_access_on_stream(self, address, size_bytes, stream)
        event = super().set_access_on_stream(address, size_bytes, stream, writable=writable)
        if self.grants_read_as == "queued":
            event.wait(10)
            return _ReadsQueued()
        return event

    def copy_to_device(
        self, dst_address: int, src_address: int, size_bytes: int, stream: int = 0
    ) -> CopyEvent:
        self.copy_streams[dst_address] = stream
        return super().copy_to_device(dst_address, src_address, size_bytes, stream)

    def export_fd(self, handle: Handle) -> int:
        self.exports += 1
        if self.exports == self.fail_export_at:
            raise MapperError("export refused (test)")
        return super().export_fd(handle)


class _ReadsQueued(CopyEvent):
    """A grant that finished but reads as still queued, so the copier's choice is seen."""

    def query(self) -> bool:
        return False

    def wait(self, timeout_seconds: float | None = None) -> None:
        return None


def memfd(size_bytes: int, fill: bytes = b"") -> int:
    fd = os.memfd_create("modelswap-test")
    os.ftruncate(fd, size_bytes)
    if fill:
        os.pwrite(fd, (fill * (size_bytes // len(fill) + 1))[:size_bytes], 0)
    return fd


def read_fd(fd: int, size_bytes: int) -> bytes:
    return os.pread(fd, size_bytes, 0)


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


@pytest.fixture
def sim() -> Iterator[CountingSim]:
    m = CountingSim()
    yield m
    m.close()


@pytest.fixture
def regions(sim: CountingSim) -> Iterator[Regions]:
    r = Regions(sim)
    r.reserve([RegionSpec("w", 8 * MIB), RegionSpec("kv", 3 * MIB, "kv")])
    yield r
    sim.synchronize()
    r.unmap_all()
    r.free()


def map_message(regions: Regions, chunk_bytes: int) -> Message:
    """MAP as the agent sends it: each region in chunks of `chunk_bytes`, one memfd each."""
    fds: list[int] = []
    body = []
    for r in regions:
        chunks = []
        for offset in range(0, r.reserved_bytes, chunk_bytes):
            chunks.append({"offset": offset, "bytes": chunk_bytes, "fd": len(fds)})
            fds.append(memfd(chunk_bytes))
        body.append({"tag": r.tag, "chunks": chunks})
    return Message(Op.MAP, 1, 1, {"regions": body}, fds)


def region_bytes(regions: Regions, tag: str) -> bytes:
    r = regions[tag]
    return ctypes.string_at(r.address, r.reserved_bytes)


def test_regions_take_their_view_rules_from_what_the_mapper_says(sim: CountingSim) -> None:
    class DeviceSim(CountingSim):
        @property
        def on_device(self) -> bool:
            return True

        @property
        def host_accessible(self) -> bool:
            return False

        @property
        def device_ordinal(self) -> int:
            return 3

    assert (sim.on_device, sim.host_accessible, sim.device_ordinal) == (False, True, 0)
    device = DeviceSim()
    try:
        regions = Regions(device)
        regions.reserve([RegionSpec("w", 3 * MIB)])
        w = regions["w"]
        assert (w.on_device, w.host_accessible, w.device_ordinal) == (True, False, 3)
        assert w.reserved_bytes == 4 * MIB and w.size_bytes == 3 * MIB
        with pytest.raises(ClientError):  # GPU memory: no CPU byte view
            w.view()
        assert [d["tag"] for d in regions.layout()] == ["w"]
        regions.free()
    finally:
        device.close()


def test_a_swap_cycle_moves_every_byte_in_pieces_over_the_streams(
    sim: CountingSim, regions: Regions
) -> None:
    copier = Copier(sim, regions, copy_piece_bytes=1 * MIB)  # pieces smaller than a chunk
    copier.map(map_message(regions, 2 * MIB))
    assert [len(r.handles) for r in regions] == [4, 2]
    weights = memfd(8 * MIB, b"weights!")
    kv = memfd(4 * MIB, b"kv")
    restore = Message(
        Op.RESTORE,
        2,
        1,
        {
            "regions": [
                {"tag": "w", "fd": 0, "bytes": 8 * MIB},
                {"tag": "kv", "fd": 1, "bytes": 4 * MIB},
            ]
        },
        [os.dup(weights), os.dup(kv)],
    )
    done = copier.restore(restore)
    assert done.regions == {"w": "restored", "kv": "restored"}
    assert done.copy["bytes"] == 12 * MIB and not done.copy["scaled"]
    assert restore.fds == []  # closed
    assert region_bytes(regions, "w") == read_fd(weights, 8 * MIB)
    assert region_bytes(regions, "kv") == read_fd(kv, 4 * MIB)
    assert regions["w"].restored and regions["kv"].restored

    ctypes.memset(regions["kv"].address, ord("z"), 4 * MIB)  # the model wrote its KV
    saved = memfd(4 * MIB)
    save = Message(
        Op.SAVE, 3, 1, {"regions": [{"tag": "kv", "fd": 0, "bytes": 4 * MIB}]}, [os.dup(saved)]
    )
    copier.save(save)
    assert save.fds == []
    assert read_fd(saved, 4 * MIB) == b"z" * (4 * MIB)
    for fd in (weights, kv, saved):
        os.close(fd)
    copier.drop_weight_sources()


@pytest.mark.parametrize("grants", ["queued", "at once"])
def test_a_chunks_pieces_follow_its_grant_unless_access_was_granted_at_once(
    sim: CountingSim, regions: Regions, grants: str
) -> None:
    sim.grants_read_as = grants
    copier = Copier(sim, regions, copy_piece_bytes=1 * MIB)
    copier.map(map_message(regions, 2 * MIB))
    weights = memfd(8 * MIB, b"w")
    body = {"regions": [{"tag": "w", "fd": 0, "bytes": 8 * MIB}]}
    copier.restore(Message(Op.RESTORE, 2, 1, body, [os.dup(weights)]))
    base = regions["w"].address
    chunks = [base + i * 2 * MIB for i in range(4)]
    assert [sim.grant_streams[c] for c in chunks] == [0, 1, 0, 1]  # chunk i on stream i % 2
    pieces = [sim.copy_streams[c + i * MIB] for c in chunks for i in range(2)]
    if grants == "queued":  # each chunk's pieces wait behind its grant, on its stream
        assert pieces == [0, 0, 1, 1, 0, 0, 1, 1]
    else:  # granted already: the pieces spread over every stream
        assert pieces == [0, 1, 0, 1, 0, 1, 0, 1]
    assert region_bytes(regions, "w") == b"w" * (8 * MIB)
    copier.drop_weight_sources()
    os.close(weights)


def test_a_weight_copy_stays_mapped_between_restores_until_its_file_changes(
    sim: CountingSim, regions: Regions
) -> None:
    copier = Copier(sim, regions, copy_piece_bytes=32 * MIB)
    copier.map(map_message(regions, 2 * MIB))

    def restore_from(fd: int) -> None:
        body = {"regions": [{"tag": "w", "fd": 0, "bytes": 8 * MIB}]}
        copier.restore(Message(Op.RESTORE, 2, 1, body, [os.dup(fd)]))

    first = memfd(8 * MIB, b"a")
    restore_from(first)
    restore_from(first)
    assert sim.host_maps == 1  # the same file: mapped once
    second = memfd(8 * MIB, b"b")
    restore_from(second)
    assert sim.host_maps == 2
    assert region_bytes(regions, "w") == b"b" * (8 * MIB)
    copier.drop_weight_sources()
    os.close(first)
    os.close(second)


def test_a_fresh_region_gets_access_and_no_copy(sim: CountingSim, regions: Regions) -> None:
    copier = Copier(sim, regions, copy_piece_bytes=32 * MIB)
    copier.map(map_message(regions, 2 * MIB))
    done = copier.restore(Message(Op.RESTORE, 2, 1, {"regions": [{"tag": "w", "fresh": True}]}))
    assert done.regions == {"w": "fresh"} and done.copy["bytes"] == 0
    assert not regions["w"].restored
    ctypes.memset(regions["w"].address, 1, 8 * MIB)  # writable: access was granted


def test_a_failed_map_unmaps_what_it_mapped_and_closes_every_fd(
    sim: CountingSim, regions: Regions
) -> None:
    copier = Copier(sim, regions, copy_piece_bytes=32 * MIB)
    before = open_fds()
    message = map_message(regions, 2 * MIB)
    message.body["regions"][1]["chunks"][1]["offset"] = 8 * MIB  # outside the kv range
    with pytest.raises(MapperError):
        copier.map(message)
    assert [r.handles for r in regions] == [[], []]
    assert open_fds() == before
    copier.map(map_message(regions, 2 * MIB))  # nothing was left mapped: it maps again


def test_mapping_over_a_mapped_region_is_refused(sim: CountingSim, regions: Regions) -> None:
    copier = Copier(sim, regions, copy_piece_bytes=32 * MIB)
    copier.map(map_message(regions, 2 * MIB))
    before = open_fds()
    with pytest.raises(ClientError) as e:
        copier.map(map_message(regions, 2 * MIB))
    assert e.value.code is ErrorCode.WRONG_STATE
    assert open_fds() == before


def test_a_copy_piece_must_have_bytes(sim: CountingSim, regions: Regions) -> None:
    with pytest.raises(ValueError, match="copy_piece_bytes"):
        Copier(sim, regions, copy_piece_bytes=0)


def test_export_names_every_chunk_and_closes_its_fds_when_one_export_fails(
    sim: CountingSim, regions: Regions
) -> None:
    Copier(sim, regions, copy_piece_bytes=32 * MIB).map(map_message(regions, 2 * MIB))
    layouts, fds = regions.export(mapped=False)
    assert fds == [] and all(d["chunks"] == [] for d in layouts)
    layouts, fds = regions.export(mapped=True)
    assert [len(d["chunks"]) for d in layouts] == [4, 2] and len(fds) == 6
    assert [d["kind"] for d in layouts] == [str(RegionKind.WEIGHTS), str(RegionKind.KV)]
    for fd in fds:
        os.close(fd)
    before = open_fds()
    sim.exports, sim.fail_export_at = 0, 5
    with pytest.raises(MapperError):
        regions.export(mapped=True)
    assert open_fds() == before
