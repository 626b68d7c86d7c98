"""The managed mapper (Grace, in-process) driven on the fake CUDA runtime, 12.x and 13.x."""

from __future__ import annotations

import os

import pytest

from modelswap_client.mappers.base import MapperError, get_mapper
from modelswap_client.mappers.managed import ManagedMapper
from tests.support.fake_cuda.api import install
from tests.support.fake_cuda.cycle import host_file, read_back, staging_file
from tests.support.fake_cuda.world import MIB, FakeCuda

SIZE = 8 * MIB


@pytest.fixture(params=[12, 13], ids=["bindings12", "bindings13"])
def fake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return install(monkeypatch, FakeCuda(major=request.param, total_bytes=16 * MIB))


def managed(**options: object) -> ManagedMapper:
    mapper = get_mapper("managed", chunk_bytes=4 * MIB, **options)
    assert isinstance(mapper, ManagedMapper)
    return mapper


def test_prefetch_round_trip_frees_hbm_and_keeps_bytes_and_address(fake: FakeCuda) -> None:
    data = os.urandom(SIZE)
    mapper = managed()
    region = mapper.reserve(SIZE)
    weights = host_file(data)
    host = mapper.map_host(weights, SIZE)
    mapper.copy_to_device(region.address, host.address, SIZE).wait(timeout_seconds=5)
    mapper.unmap_host(host)
    os.close(weights)
    mapper.prefetch_to_device(region).wait()
    assert fake.used_bytes(0) == SIZE
    mapper.prefetch_to_host(region, stream=1).wait()
    assert fake.used_bytes(0) == 0, "swap-out moves every page off the GPU"
    mapper.prefetch_to_device(region).wait()
    assert fake.used_bytes(0) == SIZE
    staging = staging_file(SIZE)
    out = mapper.map_host(staging, SIZE, writable=True)
    mapper.copy_to_host(out.address, region.address, SIZE).wait()
    mapper.unmap_host(out)
    assert read_back(staging, SIZE) == data
    os.close(staging)
    mapper.free_reservation(region)
    mapper.close()
    assert fake.violations == [] and fake.managed == {} and fake.streams == set()
    assert fake.events == {} and fake.registered == {}


def test_prefetch_and_advise_use_each_bindings_version_signature(fake: FakeCuda) -> None:
    mapper = managed()
    region = mapper.reserve(SIZE)
    mapper.prefetch_to_host(region).wait()
    mapper.prefetch_to_device(region).wait()
    to_host, to_device = fake.calls_named("cudaMemPrefetchAsync")
    advises = fake.calls_named("cudaMemAdvise")
    if fake.major >= 13:
        ptr, size, location, flags, _stream = to_host.args
        assert (location.type.name, flags) == ("cudaMemLocationTypeHost", 0)
        assert (to_device.args[2].type.name, to_device.args[2].id) == (
            "cudaMemLocationTypeDevice",
            0,
        )
        targets = [(a.args[2].name, a.args[3].type.name) for a in advises]
        assert targets == [
            ("cudaMemAdviseSetPreferredLocation", "cudaMemLocationTypeDevice"),
            ("cudaMemAdviseSetAccessedBy", "cudaMemLocationTypeDevice"),
            ("cudaMemAdviseSetPreferredLocation", "cudaMemLocationTypeHost"),
            ("cudaMemAdviseSetPreferredLocation", "cudaMemLocationTypeDevice"),
        ]
    else:
        ptr, size, target, _stream = to_host.args
        assert target == -1  # cudaCpuDeviceId
        assert to_device.args[2] == 0
        assert [a.args[3] for a in advises] == [0, 0, -1, 0]
    assert (ptr, size) == (region.address, SIZE)
    mapper.free_reservation(region)
    mapper.close()


def test_never_more_managed_memory_than_the_gpu_has_free(fake: FakeCuda) -> None:
    mapper = managed(headroom_bytes=2 * MIB)
    with pytest.raises(MapperError, match="refused"):
        mapper.reserve(16 * MIB)  # the whole GPU, but 2 MiB headroom is kept
    region = mapper.reserve(SIZE)
    mapper.prefetch_to_device(region).wait()
    mapper.prefetch_to_host(region).wait()
    other = mapper.reserve(SIZE)  # takes the room while the first is out
    mapper.prefetch_to_device(other).wait()
    with pytest.raises(MapperError, match=r"prefetch of .* refused"):
        mapper.prefetch_to_device(region)
    assert fake.used_bytes(0) == SIZE
    mapper.free_reservation(other)
    mapper.free_reservation(region)
    mapper.close()
    assert "cudaMallocManaged" in fake.names()


def test_managed_memory_takes_no_fds(fake: FakeCuda) -> None:
    mapper = managed()
    assert mapper.supports_fds is False
    fd = os.memfd_create("chunk")
    with pytest.raises(MapperError, match="cannot be shared"):
        mapper.import_fd(fd, 2 * MIB)
    with pytest.raises(OSError):
        os.fstat(fd)  # consumed even on refusal
    mapper.close()


def test_a_gpu_without_concurrent_managed_access_is_refused(fake: FakeCuda) -> None:
    fake.devices[0].attributes["CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS"] = 0
    with pytest.raises(MapperError, match="concurrent managed access"):
        managed()
