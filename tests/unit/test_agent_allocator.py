"""The agent's `allocator` setting (sim | cuda-vmm | auto), the `gpus`/`cuda` keys that go
with it, and what `build_allocator` makes of them on the fake CUDA (no GPU here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelswap_sidecar.agent.errors import SettingsError, StartupError
from modelswap_sidecar.agent.gpu_setup import build_allocator
from modelswap_sidecar.agent.settings.document import settings_from_document
from modelswap_sidecar.agent.settings.values import AgentSettings
from modelswap_sidecar.allocators.sim import SimAllocator
from modelswap_sidecar.local.rundir import RunDir
from modelswap_sidecar.local.settings import LocalSettings, agent_document
from tests.support.agent_documents import settings_document
from tests.support.fake_cuda.api import install
from tests.support.fake_cuda.world import MIB, FakeCuda

SIM_GPU = {"uuid": "sim-gpu-0", "capacityBytes": "64Mi"}


def document(**extra: Any) -> dict[str, Any]:
    return settings_document(gpu_capacity="64Mi", **extra)


@pytest.mark.parametrize("allocator", ["sim", "cuda-vmm", "auto"])
def test_each_allocator_value_is_accepted(allocator: str) -> None:
    gpus = [{"uuid": "GPU-1", "reserveBytes": "1Gi"}] if allocator == "cuda-vmm" else [SIM_GPU]
    settings = settings_from_document(document(allocator=allocator, gpus=gpus))
    assert settings.allocator == allocator
    assert settings.gpus[0].reserve_bytes == (1 << 30 if allocator == "cuda-vmm" else 0)


def test_cuda_vmm_needs_no_gpus_and_reads_the_cuda_section() -> None:
    settings = settings_from_document(
        document(allocator="cuda-vmm", gpus=None,
                 cuda={"chunkBytes": "512Mi", "linkProbe": False, "linkProbeBytes": "64Mi"})
    )  # fmt: skip
    assert settings.gpus == ()
    assert settings.cuda.chunk_bytes == 512 * MIB and settings.cuda.max_chunk_bytes == 1 << 30
    assert settings.cuda.link_probe is False and settings.cuda.link_probe_bytes == 64 * MIB


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"allocator": "cuda"}, "allocator: 'cuda' is not one of sim, cuda-vmm, auto"),
        ({"allocator": "sim", "gpus": []}, "gpus: at least one GPU"),
        ({"allocator": "cuda-vmm"}, "gpus[0].capacityBytes: a sim figure"),
        ({"allocator": "cuda-vmm", "gpus": [{"uuid": "GPU-1", "linkGBps": 50}]},
         "gpus[0].linkGBps: a sim figure"),
        ({"allocator": "cuda-vmm", "gpus": [{"reserveBytes": "1Gi"}]}, "gpus[0].uuid is required"),
        ({"allocator": "auto", "gpus": [{"uuid": "a", "capacityBytes": "lots"}]},
         "gpus[0].capacityBytes"),
        ({"cuda": {"chunkBytes": "3Mi"}}, "cuda.chunkBytes"),
        ({"cuda": {"chunkBytes": "2Gi"}}, "cuda.chunkBytes: larger than cuda.maxChunkBytes"),
        ({"cuda": {"linkProbeTimeoutSeconds": 0}}, "cuda.linkProbeTimeoutSeconds"),
        ({"cuda": ["x"]}, "cuda: expected a mapping"),
    ],
)  # fmt: skip
def test_bad_allocator_settings_name_the_key(change: dict[str, Any], field: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings_from_document(document(**change))
    assert str(caught.value).startswith(field)


def settings(**extra: Any) -> AgentSettings:
    return settings_from_document(document(**extra))


def test_sim_builds_the_configured_sim_gpus() -> None:
    allocator, inventory = build_allocator(settings(allocator="sim"))
    try:
        assert isinstance(allocator, SimAllocator)
        assert (inventory.backend, inventory.uuids, inventory.mapper) == (
            "sim",
            ("sim-gpu-0",),
            "sim",
        )
    finally:
        allocator.close()


def test_auto_without_a_driver_falls_back_to_the_sim_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakeCuda())
    fake.no_driver = True
    allocator, inventory = build_allocator(settings(allocator="auto"))
    try:
        assert inventory.backend == "sim" and inventory.uuids == ("sim-gpu-0",)
    finally:
        allocator.close()


def test_auto_without_a_driver_or_sim_gpus_names_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakeCuda())
    fake.no_driver = True
    with pytest.raises(StartupError, match=r"^gpus: the sim allocator needs at least one GPU"):
        build_allocator(settings(allocator="auto", gpus=[]))


def test_cuda_vmm_without_a_driver_is_a_startup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakeCuda())
    fake.no_driver = True
    with pytest.raises(StartupError, match=r"^allocator: cuda-vmm: .*unavailable"):
        build_allocator(settings(allocator="cuda-vmm", gpus=[]))


def test_cuda_vmm_inventory_comes_from_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    install(monkeypatch, FakeCuda(gpus=2, total_bytes=32 * MIB))
    allocator, inventory = build_allocator(
        settings(allocator="cuda-vmm", gpus=[]), cuda_options={"nvml": None}
    )
    try:
        assert inventory.backend == "cuda-vmm" and inventory.mapper == "cuda-vmm"
        assert [g.ordinal for g in inventory.gpus] == [0, 1]
        assert all(u.startswith("GPU-") for u in inventory.uuids)
        assert allocator.memory_info(allocator.locations()[1]).total_bytes == 32 * MIB
    finally:
        allocator.close()


def test_cuda_vmm_refuses_gpus_that_are_not_ordinals_0_to_n(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    fake = install(monkeypatch, FakeCuda(gpus=2))
    from modelswap_client import cuda_compat as cc

    b = cc.load()
    cc.initialize(b)
    second = cc.device_uuid(b, cc.check(b, "cuDeviceGet", b.driver.cuDeviceGet(1)))
    with pytest.raises(StartupError, match=r"^gpus: .*CUDA_VISIBLE_DEVICES"):
        build_allocator(settings(allocator="cuda-vmm", gpus=[{"uuid": second}]),
                        cuda_options={"nvml": None})  # fmt: skip
    assert fake.live_allocations() == []


def test_cuda_vmm_refuses_a_gpu_it_cannot_see(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeCuda())
    with pytest.raises(StartupError, match=r"^allocator: cuda-vmm: GPU 'GPU-nope' not found"):
        build_allocator(settings(allocator="cuda-vmm", gpus=[{"uuid": "GPU-nope"}]),
                        cuda_options={"nvml": None})  # fmt: skip


def test_local_mode_writes_the_resolved_allocator(tmp_path: Path) -> None:
    local = LocalSettings(folder=tmp_path, run_dir=RunDir(tmp_path / "run"), model_root=tmp_path,
                          defaults={}, triton_binary=tmp_path / "tritonserver")  # fmt: skip
    ports = {"triton_url": "127.0.0.1:1", "control_port": 2, "gateway_port": 3, "metrics_port": 4}
    sim = agent_document(local, **ports)  # type: ignore[arg-type]
    assert sim["allocator"] == "sim" and sim["gpus"][0]["capacityBytes"] == 240 * MIB
    cuda = agent_document(local, allocator="cuda-vmm", **ports)  # type: ignore[arg-type]
    assert cuda["allocator"] == "cuda-vmm" and cuda["gpus"] == []
    assert local.allocator == "auto"
