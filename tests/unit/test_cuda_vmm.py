"""The cuda-vmm allocator and mapper driven through full swap cycles on the fake CUDA.

Everything here runs against `tests/support/fake_cuda` (a call-recording fake of
`cuda.bindings` in 12.x and 13.x signatures), never a real GPU: these tests prove the call
sequences and the rollback discipline, not the driver's behaviour (tests/gpu does that).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator

import pytest

from modelswap_client.mappers.base import CopyError, MapperError, get_mapper
from modelswap_sidecar.allocators.base import AllocatorError, Location, OutOfDeviceMemory
from tests.support.allocators import get_allocator
from tests.support.fake_cuda.api import install
from tests.support.fake_cuda.cycle import SwapCycle, host_file, read_back, staging_file
from tests.support.fake_cuda.world import MIB, FakeCuda

DEV0 = Location.device(0)
SIZE = 10 * MIB  # five 2 MiB granules: chunks of 4 + 4 + 2 MiB exercise a short last chunk
CHUNK = 4 * MIB


@pytest.fixture(params=[12, 13], ids=["bindings12", "bindings13"])
def fake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    return install(monkeypatch, FakeCuda(major=request.param, gpus=2, total_bytes=32 * MIB))


def make_cycle(size: int = SIZE, chunk: int = CHUNK) -> SwapCycle:
    allocator = get_allocator("cuda-vmm", nvml=None, sleep=lambda s: None, chunk_bytes=chunk)
    mapper = get_mapper("cuda-vmm", chunk_bytes=chunk)
    return SwapCycle(allocator, mapper, size, chunk)


def assert_clean(fake: FakeCuda) -> None:
    """Nothing left anywhere: the fake's view, independent of the backends' counters."""
    assert fake.violations == []
    assert fake.live_allocations() == []
    assert fake.used_bytes(0) == 0
    assert fake.mappings == {}
    assert fake.reservations == {}
    assert fake.registered == {}
    assert fake.streams == set()
    assert fake.events == {}
    assert all(n == 0 for n in fake.contexts.values())


def indices(fake: FakeCuda, name: str) -> list[int]:
    return [i for i, c in enumerate(fake.calls) if c.name == name]


def test_round_trip_is_byte_exact_at_stable_addresses(fake: FakeCuda) -> None:
    data = os.urandom(SIZE)
    cycle = make_cycle()
    address = cycle.reserve()
    weights = host_file(data)
    try:
        for _ in range(3):
            cycle.swap_in(weights)
            assert fake.used_bytes(0) == SIZE
            staging = staging_file(SIZE)
            cycle.copy(staging, to_device=False)
            assert read_back(staging, SIZE) == data
            os.close(staging)
            assert cycle.reservation is not None and cycle.reservation.address == address
            cycle.swap_out()
            assert fake.used_bytes(0) == 0, "HBM must be free after swap-out"
        assert {int(c.args[0]) for c in fake.calls_named("cuMemMap")} == {
            address,
            address + CHUNK,
            address + 2 * CHUNK,
        }
    finally:
        os.close(weights)
        cycle.teardown()
    assert_clean(fake)


def test_allocator_creates_pinned_device_chunks_exportable_as_fds(fake: FakeCuda) -> None:
    allocator = get_allocator("cuda-vmm", nvml=None)
    chunk = allocator.create(Location.device(1), 4 * MIB)
    (call,) = fake.calls_named("cuMemCreate")
    size, prop, flags = call.args
    assert (size, flags) == (4 * MIB, 0)
    assert prop.type.name == "CU_MEM_ALLOCATION_TYPE_PINNED"
    assert (prop.location.type.name, prop.location.id) == ("CU_MEM_LOCATION_TYPE_DEVICE", 1)
    assert prop.requestedHandleTypes.name == "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"
    fd = allocator.export_fd(chunk)
    assert os.get_inheritable(fd) is False
    os.close(fd)
    assert "cuCtxSetCurrent" not in fake.names(), "the agent needs no CUDA context"
    assert "cuDevicePrimaryCtxRetain" not in fake.names()
    allocator.release(chunk)
    allocator.release(chunk)  # idempotent
    assert len(fake.calls_named("cuMemRelease")) == 1
    allocator.close()
    assert_clean(fake)
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_rule_order_in_a_cycle(fake: FakeCuda) -> None:
    """Access after map, the importer keeps its fd until it releases the handle (the only
    way to hand the chunk on: the driver will not export an imported allocation), synchronize
    before unmap, both release."""
    cycle = make_cycle()
    cycle.reserve()
    weights = host_file(os.urandom(SIZE))
    imported_fds: list[int] = []
    real_import = cycle.mapper.import_fd

    def spying_import(fd: int, size: int):  # type: ignore[no-untyped-def]
        handle = real_import(fd, size)
        os.fstat(fd)  # still open: kept for readopt
        imported_fds.append(fd)
        return handle

    cycle.mapper.import_fd = spying_import  # type: ignore[method-assign]
    try:
        cycle.swap_in(weights)
        cycle.swap_out()
        for fd in imported_fds:  # released with the handles
            with pytest.raises(OSError) as e:
                os.fstat(fd)
            assert e.value.errno == errno.EBADF
    finally:
        os.close(weights)
        cycle.teardown()
    assert len(imported_fds) == 3
    names = fake.names()
    maps, access = indices(fake, "cuMemMap"), indices(fake, "cuMemSetAccess")
    assert len(access) == 1 and access[0] > max(maps), "access is set after every map"
    for unmap in indices(fake, "cuMemUnmap"):
        last_copy = max(i for i, n in enumerate(names[:unmap]) if n.startswith("cuMemcpy"))
        assert "cuCtxSynchronize" in names[last_copy:unmap], "synchronize before unmap"
    # both sides release: three client handles and three agent handles
    assert len(fake.calls_named("cuMemRelease")) == 6
    assert len(fake.calls_named("cuMemImportFromShareableHandle")) == 3
    # the read-only weight file is pinned read-only
    (reg,) = fake.calls_named("cuMemHostRegister")
    assert reg.args[1:] == (SIZE, 0x08)
    assert_clean(fake)


def test_memory_stays_until_both_sides_release(fake: FakeCuda) -> None:
    cycle = make_cycle()
    cycle.reserve()
    try:
        cycle.swap_in(None)
        for chunk in list(cycle.chunks):  # the agent lets go first
            cycle.allocator.release(chunk)
            cycle.chunks.remove(chunk)
        assert fake.used_bytes(0) == SIZE, "the client's mapping still holds the memory"
        cycle.swap_out()
        assert fake.used_bytes(0) == 0
    finally:
        cycle.teardown()
    assert_clean(fake)


def test_an_open_exported_fd_pins_memory(fake: FakeCuda) -> None:
    allocator = get_allocator("cuda-vmm", nvml=None)
    chunk = allocator.create(DEV0, 2 * MIB)
    fd = allocator.export_fd(chunk)
    allocator.release(chunk)
    assert fake.used_bytes(0) == 2 * MIB
    os.close(fd)
    fake.collect()
    assert fake.used_bytes(0) == 0
    allocator.close()


def test_copies_are_split_at_chunk_boundaries_and_end_with_an_event(
    fake: FakeCuda,
) -> None:
    mapper = get_mapper("cuda-vmm", chunk_bytes=4 * MIB, streams=2)
    allocator = get_allocator("cuda-vmm", nvml=None)
    cycle = SwapCycle(allocator, mapper, SIZE, SIZE)  # one 10 MiB chunk, one 10 MiB copy
    base = cycle.reserve()
    weights = host_file(os.urandom(SIZE))
    try:
        cycle.swap_in(None)
        host = mapper.map_host(weights, SIZE)
        cycle.hosts.append(host)
        start = len(fake.calls)
        event = mapper.copy_to_device(base, host.address, SIZE, stream=1)
        issued = fake.calls[start:]
        assert [c.name for c in issued] == [
            "cuEventCreate", "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync",
            "cuEventRecord",
        ]  # fmt: skip
        pieces = [
            (int(c.args[0]) - base, int(c.args[1]) - host.address, c.args[2]) for c in issued[1:4]
        ]
        assert pieces == [(0, 0, 4 * MIB), (4 * MIB, 4 * MIB, 4 * MIB), (8 * MIB, 8 * MIB, 2 * MIB)]
        streams = {int(c.args[3]) for c in issued[1:4]} | {int(issued[4].args[1])}
        assert len(streams) == 1 and streams != {0}, "one non-default stream"
        assert fake.calls_named("cuStreamCreate")[0].args == (1,)  # CU_STREAM_NON_BLOCKING
        assert fake.calls_named("cuEventCreate")[0].args == (2,)  # CU_EVENT_DISABLE_TIMING
        fake.not_ready_polls = 2
        assert event.query() is False
        event.wait(timeout_seconds=5)
        assert event.query() is True
    finally:
        os.close(weights)
        cycle.teardown()
    assert_clean(fake)


def test_contract_violations_are_refused_before_reaching_cuda(fake: FakeCuda) -> None:
    cycle = make_cycle()
    base = cycle.reserve()
    m = cycle.mapper
    try:
        cycle.swap_in(None)
        before = len(fake.calls)
        with pytest.raises(MapperError, match="granularity"):
            m.reserve(3 * MIB)
        with pytest.raises(MapperError, match="one whole mapping"):
            m.unmap(base, 2 * MIB)  # part of the first 4 MiB mapping
        with pytest.raises(MapperError, match="one whole mapping"):
            m.unmap(base, 8 * MIB)  # spans two mappings
        with pytest.raises(MapperError, match="still mapped"):
            m.release(cycle.handles[0][1])
        with pytest.raises(MapperError, match="not a map_host buffer"):
            m.copy_to_device(base, 0x1000, 2 * MIB)
        assert len(fake.calls) == before, "refused without a CUDA call"
    finally:
        cycle.teardown()
    assert_clean(fake)


def test_copy_into_a_range_without_access_is_refused(fake: FakeCuda) -> None:
    allocator = get_allocator("cuda-vmm", nvml=None)
    mapper = get_mapper("cuda-vmm")
    chunk = allocator.create(DEV0, 2 * MIB)
    r = mapper.reserve(2 * MIB)
    h = mapper.import_fd(allocator.export_fd(chunk), 2 * MIB)
    mapper.map(r.address, 2 * MIB, h)
    fd = host_file(bytes(2 * MIB))
    host = mapper.map_host(fd, 2 * MIB)
    with pytest.raises(MapperError, match="set_access"):
        mapper.copy_to_device(r.address, host.address, 2 * MIB)
    mapper.set_access(r.address, 2 * MIB, writable=False)
    with pytest.raises(MapperError, match="access"):
        mapper.copy_to_device(r.address, host.address, 2 * MIB)  # read-only mapping
    mapper.unmap_host(host)
    os.close(fd)
    mapper.unmap(r.address, 2 * MIB)
    mapper.release(h)
    mapper.free_reservation(r)
    allocator.release(chunk)
    mapper.close()
    allocator.close()
    assert_clean(fake)


def test_readopt_after_an_agent_restart(fake: FakeCuda) -> None:
    """The client hands on the fds it imported (the driver refuses to export an imported
    allocation again, as an H200 answered); a new agent adopts them."""
    data = os.urandom(SIZE)
    cycle = make_cycle()
    base = cycle.reserve()
    weights = host_file(data)
    try:
        cycle.swap_in(weights)
        cycle.allocator.close()  # the agent dies: its handles are gone
        for chunk in list(cycle.chunks):
            cycle.chunks.remove(chunk)
        assert fake.used_bytes(0) == SIZE, "the client's mappings keep the memory"
        new_agent = get_allocator("cuda-vmm", nvml=None, chunk_bytes=CHUNK)
        cycle.allocator = new_agent
        start = len(fake.calls)
        for _offset, handle in cycle.handles:
            fd = cycle.mapper.export_fd(handle)
            chunk = new_agent.adopt_fd(DEV0, fd, handle.size_bytes)
            os.close(fd)  # adopt_fd leaves the fd to its caller
            cycle.chunks.append(chunk)
        names = [c.name for c in fake.calls[start:]]
        assert names[:2] == [
            "cuMemImportFromShareableHandle",
            "cuMemGetAllocationPropertiesFromHandle",
        ]  # fmt: skip: the client side made no CUDA call
        assert "cuMemExportToShareableHandle" not in names
        by_address = cycle.mapper.export_mapped_fd(base)  # as the client library does
        by_handle = cycle.mapper.export_fd(cycle.handles[0][1])
        assert os.fstat(by_address).st_ino == os.fstat(by_handle).st_ino
        os.close(by_address)
        os.close(by_handle)
        info = new_agent.memory_info(DEV0)
        assert info.used_bytes == SIZE
        assert info.free_bytes == 32 * MIB - SIZE
        staging = staging_file(SIZE)
        cycle.copy(staging, to_device=False)
        assert read_back(staging, SIZE) == data
        os.close(staging)
        cycle.swap_out()
        assert fake.used_bytes(0) == 0
    finally:
        os.close(weights)
        cycle.teardown()
    assert_clean(fake)


def test_readopt_at_the_wrong_location_is_refused_and_released(fake: FakeCuda) -> None:
    allocator = get_allocator("cuda-vmm", nvml=None)
    chunk = allocator.create(Location.device(1), 2 * MIB)
    fd = allocator.export_fd(chunk)
    other = get_allocator("cuda-vmm", nvml=None)
    with pytest.raises(AllocatorError, match="not device:0"):
        other.adopt_fd(DEV0, fd, 2 * MIB)
    assert other.memory_info(DEV0).used_bytes == 0
    os.close(fd)
    allocator.close()
    other.close()
    assert fake.live_allocations() == []


def test_out_of_memory_is_backed_off_and_reported(fake: FakeCuda) -> None:
    sleeps: list[float] = []
    allocator = get_allocator(
        "cuda-vmm", nvml=None, sleep=sleeps.append, oom_retries=2, oom_backoff_seconds=0.01
    )
    chunks = [allocator.create(DEV0, 8 * MIB) for _ in range(4)]  # 32 MiB: the whole GPU
    creates = len(fake.calls_named("cuMemCreate"))
    with pytest.raises(OutOfDeviceMemory) as e:
        allocator.create(DEV0, 2 * MIB)
    assert (e.value.requested_bytes, e.value.free_bytes) == (2 * MIB, 0)
    assert len(fake.calls_named("cuMemCreate")) - creates == 3, "tried, then backed off twice"
    assert sleeps == [0.01, 0.02]
    allocator.release(chunks.pop())
    assert allocator.create(DEV0, 8 * MIB).size_bytes == 8 * MIB
    allocator.close()
    assert fake.live_allocations() == []


def test_out_of_memory_recovers_when_memory_comes_back_during_backoff(fake: FakeCuda) -> None:
    allocator = get_allocator("cuda-vmm", nvml=None, oom_retries=2)
    fake.fail("cuMemCreate", code=2)  # CUDA_ERROR_OUT_OF_MEMORY once, then room again
    assert allocator.create(DEV0, 2 * MIB).size_bytes == 2 * MIB
    allocator.close()


def test_sizes_and_locations_are_checked(fake: FakeCuda) -> None:
    allocator = get_allocator("cuda-vmm", nvml=None, chunk_bytes=4 * MIB, max_chunk_bytes=8 * MIB)
    with pytest.raises(AllocatorError, match="multiple of 2 MiB"):
        allocator.create(DEV0, 3 * MIB)
    with pytest.raises(AllocatorError, match="chunk limit"):
        allocator.create(DEV0, 10 * MIB)
    with pytest.raises(AllocatorError, match="not managed"):
        allocator.create(Location.device(7), 2 * MIB)
    with pytest.raises(AllocatorError, match="not managed"):
        allocator.create(Location.host(0), 2 * MIB)  # no host NUMA cache configured
    assert allocator.locations() == [Location.device(0), Location.device(1)]
    assert "cuMemCreate" not in fake.names()
    allocator.close()


def test_host_numa_cache_chunks(fake: FakeCuda) -> None:
    allocator = get_allocator("cuda-vmm", nvml=None, host_numa_cache=True)
    assert allocator.locations()[-2:] == [Location.host(0), Location.host(1)]
    chunk = allocator.create(Location.host(1), 2 * MIB)
    prop = fake.calls_named("cuMemCreate")[0].args[1]
    assert (prop.location.type.name, prop.location.id) == ("CU_MEM_LOCATION_TYPE_HOST_NUMA", 1)
    assert fake.used_bytes(0) == 0, "host chunks do not count against HBM"
    allocator.release(chunk)
    allocator.close()


def test_gpus_are_selected_by_uuid(fake: FakeCuda) -> None:
    allocator = get_allocator("cuda-vmm", nvml=None)
    uuids = [g.uuid for g in allocator.gpus]
    assert uuids[1] == "GPU-a1010203-0405-0607-0809-0a0b0c0d0e0f"
    assert allocator.gpus[1].pci_bus_id == "0000:18:00.0"
    only = get_allocator("cuda-vmm", nvml=None, gpus=[uuids[1].upper()])
    assert only.locations() == [Location.device(1)]
    with pytest.raises(AllocatorError, match="not found"):
        get_allocator("cuda-vmm", nvml=None, gpus=["GPU-nope"])
    mapper = get_mapper("cuda-vmm", device=uuids[1])
    assert mapper.ordinal == 1  # type: ignore[attr-defined]
    mapper.close()
    with pytest.raises(MapperError, match="not visible"):
        get_mapper("cuda-vmm", device="GPU-00000000-0000-0000-0000-000000000000")
    allocator.close()
    only.close()
    uuid_calls = {c.name for c in fake.calls if c.name.startswith("cuDeviceGetUuid")}
    assert uuid_calls == ({"cuDeviceGetUuid_v2"} if fake.major == 12 else {"cuDeviceGetUuid"})


def test_a_gpu_without_vmm_or_fd_handles_is_not_managed(
    fake: FakeCuda, caplog: pytest.LogCaptureFixture
) -> None:
    fake.devices[0].attributes[
        "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED"
    ] = 0
    allocator = get_allocator("cuda-vmm", nvml=None)
    assert allocator.locations() == [Location.device(1)]
    assert "lacks VMM or POSIX-fd handles" in caplog.text
    fake.devices[1].attributes["CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"] = 0
    with pytest.raises(AllocatorError, match="no GPU supports cuda-vmm"):
        get_allocator("cuda-vmm", nvml=None)
    allocator.close()


@pytest.mark.parametrize("mode", ["no-driver", "no-device"])
def test_missing_driver_selects_no_cuda_backend(
    fake: FakeCuda, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    if mode == "no-driver":
        fake.no_driver = True
    else:
        fake.init_error = 100  # CUDA_ERROR_NO_DEVICE
    with caplog.at_level(logging.ERROR), pytest.raises(AllocatorError, match="unavailable"):
        get_allocator("cuda-vmm", nvml=None)
    expected = "cuInit raised RuntimeError" if mode == "no-driver" else "CUDA_ERROR_NO_DEVICE"
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "no CUDA backend selected" in record.getMessage()
    assert expected in record.getMessage()
    with pytest.raises(MapperError, match="unavailable"):
        get_mapper("cuda-vmm")
    assert fake.calls_named("cuDeviceGetCount") == []


def test_bindings_missing_selects_no_cuda_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "cuda", None)
    with pytest.raises(AllocatorError, match="cuda-bindings is not installed"):
        get_allocator("cuda-vmm", nvml=None)


def test_a_failed_copy_surfaces_as_copy_error(fake: FakeCuda) -> None:
    cycle = make_cycle()
    base = cycle.reserve()
    weights = host_file(bytes(SIZE))
    try:
        cycle.swap_in(None)
        host = cycle.mapper.map_host(weights, SIZE)
        cycle.hosts.append(host)
        event = cycle.mapper.copy_to_device(base, host.address, SIZE)
        fake.fail("cuEventSynchronize", code=700)  # CUDA_ERROR_ILLEGAL_ADDRESS
        with pytest.raises(CopyError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
            event.wait()
    finally:
        os.close(weights)
        cycle.teardown()
    assert_clean(fake)


# --- rollback at every call -------------------------------------------------------------------


def _full_cycle(cycle: SwapCycle) -> None:
    """Reserve, swap in from the weight file, save to staging, swap out, swap in again."""
    weights = host_file(bytes(range(256)) * (cycle.size_bytes // 256))
    try:
        cycle.reserve()
        cycle.swap_in(weights)
        staging = staging_file(cycle.size_bytes)
        try:
            cycle.copy(staging, to_device=False)
        finally:
            os.close(staging)
        cycle.swap_out()
        cycle.swap_in(weights)
        cycle.swap_out()
    finally:
        os.close(weights)


def _reference_calls() -> list[tuple[int, str, int]]:
    """(bindings major, call name, nth occurrence) of every CUDA call in a full cycle."""
    found = []
    for major in (12, 13):
        with pytest.MonkeyPatch.context() as mp:
            fake = install(mp, FakeCuda(major=major, gpus=2, total_bytes=32 * MIB))
            cycle = make_cycle(ROLLBACK_SIZE, ROLLBACK_CHUNK)
            _full_cycle(cycle)
            cycle.teardown()
            assert fake.violations == []
            seen: dict[str, int] = {}
            for call in fake.calls:
                seen[call.name] = seen.get(call.name, 0) + 1
                found.append((major, call.name, seen[call.name]))
    return found


ROLLBACK_SIZE, ROLLBACK_CHUNK = 6 * MIB, 4 * MIB  # two chunks, the last one short
REFERENCE_CALLS = _reference_calls()
# destroy calls whose failure cannot be undone: logged, and that one object leaks
_UNDOABLE = {"cuStreamDestroy", "cuEventDestroy", "cuDevicePrimaryCtxRelease"}


@pytest.fixture
def fake_for(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    def make(major: int) -> FakeCuda:
        monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
        return install(monkeypatch, FakeCuda(major=major, gpus=2, total_bytes=32 * MIB))

    yield make


@pytest.mark.parametrize(
    ("major", "name", "nth"),
    REFERENCE_CALLS,
    ids=[f"{m}-{n}#{k}" for m, n, k in REFERENCE_CALLS],
)
def test_an_error_at_any_call_rolls_back_cleanly(
    fake_for: object, major: int, name: str, nth: int
) -> None:
    fake: FakeCuda = fake_for(major)  # type: ignore[operator]
    fake.fail(name, nth=nth, code=999)  # CUDA_ERROR_UNKNOWN
    cycle: SwapCycle | None = None
    try:
        cycle = make_cycle(ROLLBACK_SIZE, ROLLBACK_CHUNK)
        _full_cycle(cycle)
    except (AllocatorError, MapperError):
        pass  # typed errors only: anything else fails the test
    if cycle is not None:
        try:
            cycle.teardown()
        except (AllocatorError, MapperError):
            cycle.teardown()  # the one-shot failure hit the teardown itself: retry it
    # whatever failed, the error was typed (never a raw CUDA failure) and nothing leaks
    assert fake.violations == []
    assert fake.live_allocations() == []
    assert fake.used_bytes(0) == 0
    assert fake.mappings == {} and fake.reservations == {} and fake.registered == {}
    leaked = len(fake.streams) + len(fake.events) + sum(fake.contexts.values())
    assert leaked == (1 if name in _UNDOABLE else 0)
