"""The real engine, protocol server and client library driving the CUDA backends (on the
fake `cuda.bindings`) through swap cycles, all in this process: agent, server thread and
client threads. Proves the backends fit the engine's use of the interfaces, including
calls from the client library's own threads (CUDA's current context is per thread)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from modelswap_api.wire import KvMode
from modelswap_client.client import RegionSpec, attach
from modelswap_client.mappers.cuda_vmm import CudaVmmMapper
from modelswap_sidecar.allocators.cuda_vmm import CudaVmmAllocator
from modelswap_sidecar.engine.core import Engine, EngineSettings
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import ModelConfig
from modelswap_sidecar.engine.server import EngineServer
from modelswap_sidecar.engine.vouching import RegisteredVoucher
from tests.support.fake_cuda.api import install
from tests.support.fake_cuda.cycle import host_file, read_back, staging_file
from tests.support.fake_cuda.world import MIB, FakeCuda

SIZE = 10 * MIB


@pytest.mark.parametrize("major", [12, 13])
def test_engine_swaps_a_model_through_cuda_vmm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, major: int
) -> None:
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    fake = install(monkeypatch, FakeCuda(major=major, total_bytes=64 * MIB))
    allocator = CudaVmmAllocator(nvml=None, chunk_bytes=4 * MIB, max_chunk_bytes=4 * MIB)
    store = HostStore(tmp_path / "store", {0: 256 * MIB})
    voucher = RegisteredVoucher()
    voucher.register(os.getpid(), "m")
    engine = Engine(
        allocator,
        store,
        voucher,
        EngineSettings(readopt_grace_seconds=1.0),
        decider=lambda name: engine.swap_in(name),  # noqa: PLW0108 - built by this call
    )
    engine.recover()
    engine.add_model(ModelConfig("m", 0, KvMode.DISCARD))
    server = EngineServer(engine, tmp_path / "agent.sock")
    server.start()
    mapper = CudaVmmMapper(chunk_bytes=4 * MIB)
    att = None
    data = os.urandom(SIZE)
    try:
        att = attach("m", [RegionSpec("w", SIZE)], socket_path=str(tmp_path / "agent.sock"),
                     mapper=mapper, timeout_seconds=30)  # fmt: skip
        region = att.regions["w"]
        address = region.address
        assert fake.used_bytes(0) >= SIZE
        weights = host_file(data)  # "load from the model source" into the mapped region
        host = mapper.map_host(weights, SIZE)
        mapper.copy_to_device(address, host.address, SIZE).wait(timeout_seconds=10)
        mapper.unmap_host(host)
        os.close(weights)
        att.commit()  # the one-time save: device → host store
        for _ in range(3):
            engine.swap_out("m")
            assert fake.used_bytes(0) == 0, "swap-out freed the HBM on both sides"
            engine.swap_in("m")
            assert att.regions["w"].address == address
            out = staging_file(SIZE)
            buf = mapper.map_host(out, SIZE, writable=True)
            mapper.copy_to_host(buf.address, address, SIZE).wait(timeout_seconds=10)
            mapper.unmap_host(buf)
            assert read_back(out, SIZE) == data
            os.close(out)
        names = fake.names()
        assert "cuMemImportFromShareableHandle" in names and "cuMemHostRegister" in names
        assert fake.violations == []
    finally:
        if att is not None:
            att.close()
        else:
            mapper.close()
        server.close()
        engine.close()
        allocator.close()
    assert fake.violations == []
    assert fake.live_allocations() == []
    assert fake.mappings == {} and fake.reservations == {} and fake.registered == {}
