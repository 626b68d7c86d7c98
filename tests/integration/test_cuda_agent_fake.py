"""The agent wired to the cuda-vmm backends, on the fake `cuda.bindings` (no GPU here).

- `assembly.build()` with `allocator: auto` on a fake machine of two GPUs: the inventory
  (UUIDs, ordinals, product names, HBM totals) comes from the allocator, not from configured
  sim GPUs; the link probe runs once per GPU in a real child process (the fake installed there
  by `tests/support/fake_cuda_site`) and its kind and GB/s reach `GET /v1/node`, the
  SwapNode report and the metrics; models are loaded with the `cuda-vmm` mapper and their
  GPU's UUID as Triton parameters.
- the client library given that UUID (`attach(mapper="cuda-vmm", device=…)`) selects
  that GPU in the model process: its primary context and its chunks are on GPU 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from modelswap_api.wire import KvMode
from modelswap_client import cuda_compat as cc
from modelswap_client.client import RegionSpec, attach
from modelswap_sidecar.agent.assembly import build
from modelswap_sidecar.agent.gpu_setup import measure_links
from modelswap_sidecar.agent.ports.node_report import NodeReporter
from modelswap_sidecar.agent.settings.document import settings_from_document
from modelswap_sidecar.agent.settings.values import AgentSettings
from modelswap_sidecar.allocators.cuda_vmm import CudaVmmAllocator
from modelswap_sidecar.engine.core import Engine, EngineSettings
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import ModelConfig
from modelswap_sidecar.engine.server import EngineServer
from modelswap_sidecar.engine.vouching import RegisteredVoucher
from modelswap_sidecar.metrics import register_link_metrics
from modelswap_sidecar.triton.config import GPU_UUID_KEY, MAPPER_KEY
from tests.support.fake_cuda.api import install
from tests.support.fake_cuda.world import MIB, FakeCuda

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "tests" / "support" / "fake_cuda_site"


@pytest.fixture
def shm_store() -> Iterator[Path]:
    """A host-store folder on tmpfs: a GPU backend refuses a disk-backed one."""
    folder = Path(tempfile.mkdtemp(prefix="modelswap-cuda-agent-", dir="/dev/shm"))
    try:
        yield folder / "store"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def agent_settings(tmp_path: Path, store: Path | None = None, **extra: Any) -> AgentSettings:
    doc = {
        "nodeName": "gpu-node",
        "allocator": "auto",
        "hostStore": {"dir": str(store or tmp_path / "store"), "capacityBytes": "256Mi"},
        "socketDir": str(tmp_path / "sock"),
        "stateDir": str(tmp_path / "state"),
        "sourceCache": {"dir": str(tmp_path / "cache")},
        "control": {"tokenFile": str(tmp_path / "token")},
        "triton": {"url": "127.0.0.1:9", "repository": str(tmp_path / "repo")},
        "cuda": {"chunkBytes": "4Mi", "maxChunkBytes": "8Mi", "linkProbeBytes": "8Mi",
                 "linkProbeTimeoutSeconds": 60},
        **extra,
    }  # fmt: skip
    return settings_from_document(doc)


def fake_child_env(monkeypatch: pytest.MonkeyPatch, gpus: int) -> None:
    """The probe child (a real `python -m …link_probe`) sees the same fake machine."""
    path = os.pathsep.join([str(SITE), str(ROOT), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("MODELSWAP_FAKE_CUDA_GPUS", str(gpus))


@pytest.mark.timeout(60)
def test_agent_in_cuda_vmm_mode_takes_its_gpus_from_the_allocator_and_probes_links(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shm_store: Path
) -> None:
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    fake = install(monkeypatch, FakeCuda(major=13, gpus=2, total_bytes=64 * MIB))
    fake.devices[1].name = "Fake GH200"
    fake_child_env(monkeypatch, gpus=2)
    b = cc.load()
    cc.initialize(b)
    uuids = [cc.device_uuid(b, cc.check(b, "x", b.driver.cuDeviceGet(i))) for i in range(2)]
    settings = agent_settings(
        tmp_path,
        shm_store,
        gpus=[{"uuid": uuids[1].upper(), "reserveBytes": "8Mi"}, {"uuid": uuids[0]}],
    )
    assert settings.allocator == "auto" and settings.gpus[0].capacity_bytes is None

    async def scenario() -> None:
        async with contextlib.AsyncExitStack() as stack:
            agent = await build(settings, stack, cuda_options={"nvml": None})
            assert agent.inventory.backend == "cuda-vmm"
            assert agent.inventory.uuids == tuple(uuids), "by ordinal, from the driver"
            assert isinstance(agent.allocator, CudaVmmAllocator)
            node = await agent.backend.node_info()
            assert [g.uuid for g in node.gpus] == uuids
            assert [g.ordinal for g in node.gpus] == [0, 1]
            assert [g.product for g in node.gpus] == ["Fake H100", "Fake GH200"]
            assert [g.hbm_total_bytes for g in node.gpus] == [64 * MIB, 64 * MIB]
            assert [g.hbm_reserved_bytes for g in node.gpus] == [0, 8 * MIB], "by UUID"
            for gpu in node.gpus:  # the fake's copy engine runs at 50 GB/s
                assert gpu.link is not None and gpu.link.kind == "pcie"
                assert gpu.link.host_to_device_gbps == pytest.approx(50.0, rel=0.02)
                assert gpu.link.device_to_host_gbps == pytest.approx(50.0, rel=0.02)
            wire = node.to_dict()["gpus"][1]["link"]
            assert wire["kind"] == "pcie" and wire["hostToDeviceGBps"] == pytest.approx(50, 0.02)
            value = agent.registry.get_sample_value(
                "modelswap_gpu_link_bytes_per_second",
                {"gpu": uuids[1], "kind": "pcie", "direction": "h2d"},
            )
            assert value == pytest.approx(50e9, rel=0.02)
            reporter = NodeReporter(
                agent.actuator,
                node_name="gpu-node",
                agent_version="test",
                links=agent.links,
                products=[g.product for g in agent.inventory.gpus],
                control_endpoint=None,
                gateway_endpoint=None,
            )
            report = reporter()
            assert [g.link for g in report.gpus] == [g.link for g in node.gpus]
            assert report.gpus[1].product == "Fake GH200"
            # what a model loaded on GPU 1 is told (Triton parameters)
            model = SimpleNamespace(uid="u-1", gpu=1, weights_bytes=4 * MIB, kv_cache_bytes=0)
            parameters = agent.actuator.loader.parameters(model).as_parameters()
            assert parameters[MAPPER_KEY] == "cuda-vmm"
            assert parameters[GPU_UUID_KEY] == uuids[1]
        assert fake.violations == [] and fake.live_allocations() == []

    asyncio.run(scenario())
    assert not fake.calls_named("cuDevicePrimaryCtxRetain"), "the agent itself has no context"
    probes = [c for c in fake.calls if c.name == "cuMemAllocHost"]
    assert probes == [], "the probe ran in child processes, not in the agent"


def test_a_failed_probe_reports_an_unknown_link(tmp_path: Path) -> None:
    from modelswap_sidecar.gpu.inventory import GpuInventory, NodeGpu
    from modelswap_sidecar.gpu.link_probe import LinkProbeError

    def failing(uuid: str, **_: Any) -> Any:
        raise LinkProbeError(f"link probe for {uuid} timed out after 60s")

    settings = agent_settings(tmp_path)
    inventory = GpuInventory("cuda-vmm", (NodeGpu(uuid="GPU-x", ordinal=0, product="p"),))
    links = asyncio.run(measure_links(settings, inventory, prober=failing))
    assert links[0].kind is None and links[0].host_to_device_gbps is None
    registry = CollectorRegistry()
    register_link_metrics(registry, ["GPU-x"], links)
    assert registry.get_sample_value(
        "modelswap_gpu_link_bytes_per_second",
        {"gpu": "GPU-x", "kind": "unknown", "direction": "h2d"},
    ) is None  # fmt: skip


@pytest.mark.timeout(60)
def test_client_selects_the_gpu_the_agent_names_by_uuid(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    fake = install(monkeypatch, FakeCuda(major=12, gpus=2, total_bytes=64 * MIB))
    allocator = CudaVmmAllocator(nvml=None, chunk_bytes=4 * MIB, max_chunk_bytes=4 * MIB)
    uuid = allocator.gpus[1].uuid
    store = HostStore(tmp_path / "store", {0: 64 * MIB, 1: 64 * MIB})
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
    engine.add_model(ModelConfig("m", 1, KvMode.DISCARD))
    server = EngineServer(engine, tmp_path / "agent.sock")
    server.start()
    att = None
    try:
        att = attach("m", [RegionSpec("w", 8 * MIB)], socket_path=str(tmp_path / "agent.sock"),
                     mapper="cuda-vmm", device=uuid, timeout_seconds=30)  # fmt: skip
        # the mapper resolved the UUID to ordinal 1 by reading the UUIDs (cuDeviceGetUuid)
        assert att.regions["w"].device_ordinal == 1
        assert att.regions["w"].cuda_view().__cuda_array_interface__["data"][0] != 0
        assert fake.contexts.get(1) == 1 and not fake.contexts.get(0)
        assert fake.used_bytes(1) >= 8 * MIB and fake.used_bytes(0) == 0
        uuid_calls = [c for c in fake.calls if c.name.startswith("cuDeviceGetUuid")]
        assert uuid_calls, "the client looked the UUID up"
        assert fake.violations == []
    finally:
        if att is not None:
            att.close()
        server.close()
        engine.close()
        allocator.close()
    assert fake.live_allocations() == [] and fake.mappings == {} and fake.reservations == {}
