"""The cuda-bindings version adapter and the NVML memory reader (fakes of both)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from modelswap_client import cuda_compat as cc
from modelswap_sidecar.allocators.base import Location
from modelswap_sidecar.gpu.nvml import NvmlMemory, overhead_bytes
from tests.support.allocators import get_allocator
from tests.support.fake_cuda.api import install
from tests.support.fake_cuda.world import MIB, FakeCuda


@pytest.fixture(params=[12, 13], ids=["bindings12", "bindings13"])
def fake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return install(monkeypatch, FakeCuda(major=request.param, total_bytes=32 * MIB))


def test_result_tuples_unpack_by_arity(fake: FakeCuda) -> None:
    b = cc.load()
    assert b.major == fake.major
    assert cc.check(b, "x", (0,)) is None
    assert cc.check(b, "x", (0, 5)) == 5
    assert cc.check(b, "x", (0, 5, 6)) == (5, 6)
    with pytest.raises(cc.CudaError) as e:
        cc.check(b, "cuMemCreate", (2, None))
    assert (e.value.call, e.value.code, e.value.name) == (
        "cuMemCreate",
        2,
        "CUDA_ERROR_OUT_OF_MEMORY",
    )
    assert e.value.out_of_memory


def test_version_is_read_from_the_bindings_or_guessed_from_their_api(fake: FakeCuda) -> None:
    package = sys.modules["cuda.bindings"]
    del package.__version__  # type: ignore[attr-defined]
    b = cc.load()
    assert b.major == fake.major, "12.x still has cuMemPrefetchAsync_v2, 13.x does not"
    assert "guessed" in b.version


def test_driver_prefetch_and_advise_signatures(fake: FakeCuda) -> None:
    b = cc.load()
    cc.initialize(b)
    d = b.driver
    advice = d.CUmem_advise.CU_MEM_ADVISE_SET_PREFERRED_LOCATION
    fake.managed[0x1000] = (types.SimpleNamespace(size=2 * MIB, alloc_id=1), None)  # type: ignore[assignment]
    ctx = cc.check(b, "r", d.cuDevicePrimaryCtxRetain(0))
    cc.check(b, "s", d.cuCtxSetCurrent(ctx))
    cc.prefetch_async(b, 0x1000, 2 * MIB, None, 0)
    cc.mem_advise(b, 0x1000, 2 * MIB, advice, 0)
    (prefetch,) = fake.calls_named("cuMemPrefetchAsync")
    (advise,) = fake.calls_named("cuMemAdvise")
    if fake.major >= 13:
        assert len(prefetch.args) == 5 and prefetch.args[3] == 0  # location, flags, stream
        assert prefetch.args[2].type.name == "CU_MEM_LOCATION_TYPE_HOST"
        assert (advise.args[3].type.name, advise.args[3].id) == ("CU_MEM_LOCATION_TYPE_DEVICE", 0)
    else:
        assert len(prefetch.args) == 4 and prefetch.args[2] == -1  # CU_DEVICE_CPU
        assert advise.args[3] == 0
    assert "cuMemPrefetchAsync_v2" not in fake.names()


def test_missing_driver_and_missing_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakeCuda())
    fake.no_driver = True
    b = cc.load()
    with pytest.raises(cc.CudaUnavailable, match=r"no CUDA driver: cuInit raised RuntimeError"):
        cc.initialize(b)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(cc.CudaUnavailable, match="not installed"):
        cc.load()


def test_uuid_is_formatted_like_nvml(fake: FakeCuda) -> None:
    b = cc.load()
    cc.initialize(b)
    assert cc.device_uuid(b, 0) == "GPU-a0010203-0405-0607-0809-0a0b0c0d0e0f"


# --- NVML -------------------------------------------------------------------------------------


class FakeNvml(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("pynvml")
        self.calls: list[str] = []
        self.free = 20 * MIB
        self.procs: list[Any] = []

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.calls.append("init")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:  # noqa: N802
        if not uuid.startswith("GPU-a0"):
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return uuid

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:  # noqa: N802
        return types.SimpleNamespace(total=32 * MIB, free=self.free, used=32 * MIB - self.free)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:  # noqa: N802
        return self.procs


def test_allocator_memory_info_comes_from_nvml(
    fake: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    allocator = get_allocator("cuda-vmm")
    chunk = allocator.create(Location.device(0), 4 * MIB)
    info = allocator.memory_info(Location.device(0))
    assert (info.total_bytes, info.free_bytes, info.used_bytes) == (32 * MIB, 20 * MIB, 4 * MIB)
    nvml.procs = [
        types.SimpleNamespace(pid=10, usedGpuMemory=900 * MIB),
        types.SimpleNamespace(pid=11, usedGpuMemory=None),
    ]
    overhead = allocator.process_overhead_bytes(Location.device(0), [10, 11, 12], {10: 600 * MIB})
    assert overhead == {10: 300 * MIB, 11: None, 12: 0}
    allocator.release(chunk)
    allocator.close()
    assert nvml.calls == ["init", "shutdown"]


def test_without_nvml_memory_info_falls_back_to_cuda_totals(
    fake: FakeCuda, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert NvmlMemory.open() is None
    assert "nvidia-ml-py is not installed" in caplog.text
    allocator = get_allocator("cuda-vmm")
    allocator.create(Location.device(0), 4 * MIB)  # released by close()
    info = allocator.memory_info(Location.device(0))
    assert (info.total_bytes, info.used_bytes, info.free_bytes) == (32 * MIB, 4 * MIB, 28 * MIB)
    assert allocator.process_overhead_bytes(Location.device(0), [1]) == {1: None}
    allocator.close()
    assert fake.live_allocations() == []


def test_overhead_is_clamped_at_zero() -> None:
    assert overhead_bytes({5: 100}, [5], {5: 300}) == {5: 0}


@pytest.mark.parametrize(
    ("mode", "expected"), [("ok", "cuda-vmm"), ("no-driver", "sim"), ("no-vmm", "sim")]
)
def test_auto_backend_choice(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, mode: str, expected: str
) -> None:
    from modelswap_sidecar.gpu.devices import choose_allocator_backend

    fake = install(monkeypatch, FakeCuda())
    fake.no_driver = mode == "no-driver"
    if mode == "no-vmm":
        fake.devices[0].attributes["CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"] = 0
    with caplog.at_level("INFO"):
        assert choose_allocator_backend() == expected
    assert f"allocator backend: {expected}" in caplog.text
    if mode == "no-driver":
        assert "no CUDA backend selected: no CUDA driver" in caplog.text
    assert choose_allocator_backend("sim") == "sim"
