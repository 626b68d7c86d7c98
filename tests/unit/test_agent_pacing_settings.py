"""`gpus[].paceGBps`: the sim GPU's emulated link that every model's copies are paced to —
read and checked by name, refused off sim, handed to the engine per GPU, reported as the
sim link, and set for every sim GPU by `modelswap up --pace-gbps`."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import pytest

from modelswap_sidecar.agent.assembly import sim_paces
from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.gpu_setup import measure_links
from modelswap_sidecar.agent.ports.cluster_heartbeat import link_speeds
from modelswap_sidecar.agent.settings.document import settings_from_document
from modelswap_sidecar.agent.settings.values import AgentSettings
from modelswap_sidecar.gpu.inventory import GpuInventory, NodeGpu
from modelswap_sidecar.local.command import settings_from_args
from modelswap_sidecar.local.errors import LocalModeError
from modelswap_sidecar.local.rundir import RunDir
from modelswap_sidecar.local.settings import LocalSettings, agent_document
from tests.support.agent_documents import settings_document


def document(gpus: list[dict[str, Any]], allocator: str = "sim") -> dict[str, Any]:
    return settings_document(gpus=gpus, allocator=allocator)


def sim_settings(*paces: float | None) -> AgentSettings:
    gpus = [
        {"uuid": f"sim-gpu-{i}", "capacityBytes": "64Mi"}
        | ({} if pace is None else {"paceGBps": pace})
        for i, pace in enumerate(paces)
    ]
    return settings_from_document(document(gpus))


def sim_inventory(n: int) -> GpuInventory:
    return GpuInventory("sim", tuple(NodeGpu(f"sim-gpu-{i}", i, "sim", 0) for i in range(n)))


def test_a_paced_sim_gpu_tells_the_engine_its_pace_in_bytes_per_second() -> None:
    settings = sim_settings(1.5, None)
    assert [g.pace_gbps for g in settings.gpus] == [1.5, None]
    # only the paced GPU's models are told a pace (ordinal → bytes/s)
    assert sim_paces(settings, sim_inventory(2)) == {0: 1.5e9}
    # auto that chose cuda-vmm ignores the sim entries, their paces with them
    cuda = GpuInventory("cuda-vmm", (NodeGpu("GPU-1", 0, "H100", 0),))
    assert sim_paces(settings, cuda) == {}


def test_the_sim_link_reported_is_the_pace_unless_one_is_configured() -> None:
    settings = settings_from_document(
        document([{"uuid": "a", "capacityBytes": "64Mi", "paceGBps": 2},
                  {"uuid": "b", "capacityBytes": "64Mi", "paceGBps": 2, "linkGBps": 9},
                  {"uuid": "c", "capacityBytes": "64Mi"}])
    )  # fmt: skip
    links = asyncio.run(measure_links(settings, sim_inventory(3)))
    assert [link.host_to_device_gbps for link in links] == [2.0, 9.0, None]


@pytest.mark.parametrize(
    ("gpu", "allocator", "field"),
    [
        ({"capacityBytes": "64Mi", "paceGBps": 0}, "sim", "gpus[0].paceGBps: must be positive"),
        ({"capacityBytes": "64Mi", "paceGBps": -2}, "sim", "gpus[0].paceGBps: must be positive"),
        ({"capacityBytes": "64Mi", "paceGBps": "fast"}, "sim", "gpus[0].paceGBps: not a number"),
        (
            {"capacityBytes": "64Mi", "paceGBps": float("nan")},
            "sim",
            "gpus[0].paceGBps: must be finite",
        ),
        ({"capacityBytes": "64Mi", "paceGBps": "inf"}, "sim", "gpus[0].paceGBps: must be finite"),
        ({"uuid": "GPU-1", "paceGBps": 2}, "cuda-vmm", "gpus[0].paceGBps: copy pacing emulates"),
        ({"uuid": "GPU-1", "paceGBps": 2}, "auto", "gpus[0].paceGBps: copy pacing emulates"),
    ],
)
def test_a_bad_pace_is_refused_naming_the_field(
    gpu: dict[str, Any], allocator: str, field: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        settings_from_document(document([gpu], allocator))
    assert str(caught.value).startswith(field)


def test_auto_takes_a_pace_on_its_sim_fallback_entries() -> None:
    settings = settings_from_document(
        document([{"uuid": "s", "capacityBytes": "64Mi", "paceGBps": 1}], "auto")
    )
    assert settings.gpus[0].pace_gbps == 1.0


def local_args(tmp_path: Path, **given: Any) -> argparse.Namespace:
    triton = tmp_path / "tritonserver"
    triton.touch()
    values: dict[str, Any] = {
        "folder": tmp_path, "run_dir": tmp_path / "run", "model_root": None, "defaults": None,
        "host": "127.0.0.1", "port": 0, "sim_gpu_bytes": ["64Mi", "32Mi"], "allocator": "sim",
        "pace_gbps": None, "triton_binary": triton, "log_level": "info",
    }  # fmt: skip
    return argparse.Namespace(**(values | given))


def test_modelswap_up_paces_every_sim_gpu(tmp_path: Path) -> None:
    local: LocalSettings = settings_from_args(local_args(tmp_path, pace_gbps=1.5))
    assert local.pace_gbps == 1.5
    ports = {"triton_url": "127.0.0.1:1", "control_port": 2, "gateway_port": 3, "metrics_port": 4}
    doc = agent_document(local, **ports)  # type: ignore[arg-type]
    assert [g.get("paceGBps") for g in doc["gpus"]] == [1.5, 1.5]
    # the document is one the agent accepts, with the pace on each GPU
    assert [g.pace_gbps for g in settings_from_document(doc).gpus] == [1.5, 1.5]
    unpaced = settings_from_args(local_args(tmp_path))
    assert "paceGBps" not in agent_document(unpaced, **ports)["gpus"][0]  # type: ignore[arg-type]
    cuda = agent_document(local, allocator="cuda-vmm", **ports)  # type: ignore[arg-type]
    assert cuda["gpus"] == []
    assert isinstance(local.run_dir, RunDir)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"pace_gbps": 0.0}, "--pace-gbps: 0.0 is not a positive number"),
        ({"pace_gbps": float("nan")}, "--pace-gbps: nan is not a positive number"),
        ({"pace_gbps": 2.0, "allocator": "cuda-vmm"}, "--pace-gbps: copy pacing emulates"),
    ],
)
def test_modelswap_up_refuses_a_bad_pace_by_flag(
    tmp_path: Path, given: dict[str, Any], message: str
) -> None:
    with pytest.raises(LocalModeError) as caught:
        settings_from_args(local_args(tmp_path, **given))
    assert str(caught.value).startswith(message)


def test_the_swapnode_reports_a_paced_sim_gpus_pace_as_its_link() -> None:
    settings = settings_from_document(
        document([{"uuid": "a", "capacityBytes": "64Mi", "paceGBps": 2},
                  {"uuid": "b", "capacityBytes": "64Mi", "linkGBps": 9}])
    )  # fmt: skip
    assert asyncio.run(link_speeds(settings)) == [2.0, 9.0]
