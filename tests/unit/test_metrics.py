"""Node metrics through a fresh CollectorRegistry, read back with get_sample_value."""

from __future__ import annotations

import re

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from modelswap_sidecar.metrics import (
    GpuSample,
    ModelLabels,
    ModelSample,
    NodeMetrics,
    NodeSample,
    metrics_app,
)

LLAMA = ModelLabels(uid="u-1", namespace="team-a", name="llama")
LLAMA_LABELS = {"uid": "u-1", "namespace": "team-a", "model": "llama"}


class State:
    """A provider whose answer the test changes between scrapes."""

    def __init__(self) -> None:
        self.sample = NodeSample()
        self.fail = False

    def __call__(self) -> NodeSample:
        if self.fail:
            raise RuntimeError("engine is gone")
        return self.sample


def fresh() -> tuple[CollectorRegistry, NodeMetrics, State]:
    registry = CollectorRegistry()
    state = State()
    return registry, NodeMetrics(registry, state), state


def test_swaps_count_time_and_bytes() -> None:
    registry, metrics, _ = fresh()
    metrics.observe_swap_in(LLAMA, "gpu-0", seconds=0.3, bytes_moved=1 << 30)
    metrics.observe_swap_in(LLAMA, "gpu-0", seconds=2.0, bytes_moved=1 << 30)
    metrics.observe_swap_out(
        LLAMA, "gpu-0", reason="Idle", seconds=0.05, bytes_moved=0, idle_seconds=900
    )
    value = registry.get_sample_value
    assert value("modelswap_swap_ins_total", LLAMA_LABELS) == 2
    assert value("modelswap_swap_outs_total", {**LLAMA_LABELS, "reason": "Idle"}) == 1
    assert value("modelswap_swap_in_duration_seconds_count", LLAMA_LABELS) == 2
    assert value("modelswap_swap_in_duration_seconds_sum", LLAMA_LABELS) == pytest.approx(2.3)
    assert value("modelswap_swap_in_duration_seconds_bucket", {**LLAMA_LABELS, "le": "0.5"}) == 1
    assert value("modelswap_swap_bytes_total", {"gpu": "gpu-0", "direction": "in"}) == 2 << 30
    assert value("modelswap_swap_bytes_total", {"gpu": "gpu-0", "direction": "out"}) == 0
    assert value("modelswap_eviction_age_seconds_bucket", {"reason": "Idle", "le": "600.0"}) == 0
    assert value("modelswap_eviction_age_seconds_bucket", {"reason": "Idle", "le": "1800.0"}) == 1


def test_loads_restarts_and_the_source_cache_are_counted() -> None:
    registry, metrics, _ = fresh()
    metrics.observe_load(LLAMA, 12.0)
    metrics.observe_unload(LLAMA, 0.4)
    metrics.triton_restarts.inc()
    metrics.source_cache_hits.inc(3)
    metrics.source_cache_misses.inc()
    value = registry.get_sample_value
    assert value("modelswap_load_duration_seconds_sum", LLAMA_LABELS) == 12.0
    assert value("modelswap_unload_duration_seconds_count", LLAMA_LABELS) == 1
    assert value("modelswap_triton_restarts_total") == 1
    assert value("modelswap_source_cache_hits_total") == 3
    assert value("modelswap_source_cache_misses_total") == 1


def test_state_is_read_from_the_provider_at_every_scrape() -> None:
    registry, _, state = fresh()
    state.sample = NodeSample(
        gpus=[
            GpuSample(
                gpu="gpu-0",
                total_bytes=80 << 30,
                reserved_bytes=2 << 30,
                overhead_bytes=1 << 30,
                used_bytes=16 << 30,
                host_store_bytes=20 << 30,
                host_store_capacity_bytes=200 << 30,
            )
        ],
        models=[
            ModelSample(
                model=LLAMA,
                state="Resident",
                resident_bytes=16 << 30,
                host_bytes=20 << 30,
                kv_device_blocks=120,
                kv_host_blocks=30,
            )
        ],
    )
    value = registry.get_sample_value
    assert value("modelswap_hbm_total_bytes", {"gpu": "gpu-0"}) == 80 << 30
    assert value("modelswap_hbm_reserved_bytes", {"gpu": "gpu-0"}) == 2 << 30
    assert value("modelswap_hbm_overhead_bytes", {"gpu": "gpu-0"}) == 1 << 30
    assert value("modelswap_hbm_used_bytes", {"gpu": "gpu-0"}) == 16 << 30
    assert value("modelswap_host_store_bytes", {"gpu": "gpu-0"}) == 20 << 30
    assert value("modelswap_host_store_capacity_bytes", {"gpu": "gpu-0"}) == 200 << 30
    assert value("modelswap_model_state", {**LLAMA_LABELS, "state": "Resident"}) == 1
    assert value("modelswap_model_state", {**LLAMA_LABELS, "state": "SwappedOut"}) == 0
    assert value("modelswap_model_resident_bytes", LLAMA_LABELS) == 16 << 30
    assert value("modelswap_kv_blocks", {**LLAMA_LABELS, "tier": "device"}) == 120
    assert value("modelswap_kv_blocks", {**LLAMA_LABELS, "tier": "host"}) == 30

    state.sample = NodeSample(
        models=[ModelSample(model=LLAMA, state="SwappedOut", resident_bytes=0, host_bytes=1)]
    )
    assert value("modelswap_model_state", {**LLAMA_LABELS, "state": "Resident"}) == 0
    assert value("modelswap_model_state", {**LLAMA_LABELS, "state": "SwappedOut"}) == 1
    assert value("modelswap_hbm_total_bytes", {"gpu": "gpu-0"}) is None  # read, not kept


def test_a_failing_provider_leaves_the_counted_metrics_served() -> None:
    registry, metrics, state = fresh()
    metrics.triton_restarts.inc()
    state.fail = True
    assert registry.get_sample_value("modelswap_triton_restarts_total") == 1
    assert registry.get_sample_value("modelswap_hbm_used_bytes", {"gpu": "gpu-0"}) is None


def test_a_forgotten_model_leaves_no_series_behind() -> None:
    registry, metrics, _ = fresh()
    other = ModelLabels(uid="u-2", namespace="team-b", name="llama")
    for model in (LLAMA, other):
        metrics.observe_swap_in(model, "gpu-0", seconds=0.1, bytes_moved=1)
        metrics.observe_swap_out(
            model, "gpu-0", reason="Pressure", seconds=0.1, bytes_moved=1, idle_seconds=1
        )
    metrics.forget_model(LLAMA)
    metrics.forget_model(LLAMA)  # twice is fine
    value = registry.get_sample_value
    assert value("modelswap_swap_ins_total", LLAMA_LABELS) is None
    assert value("modelswap_swap_outs_total", {**LLAMA_LABELS, "reason": "Pressure"}) is None
    assert (
        value("modelswap_swap_ins_total", {"uid": "u-2", "namespace": "team-b", "model": "llama"})
        == 1
    )


def test_every_metric_is_named_modelswap_with_its_unit() -> None:
    registry, metrics, state = fresh()
    state.sample = NodeSample(
        gpus=[GpuSample(gpu="g", total_bytes=1, reserved_bytes=0, overhead_bytes=0,
                        used_bytes=0, host_store_bytes=0, host_store_capacity_bytes=1)],
        models=[ModelSample(model=LLAMA, state="Loading", resident_bytes=0, host_bytes=0)],
    )  # fmt: skip
    metrics.observe_swap_in(LLAMA, "g", seconds=0.1, bytes_moved=1)
    metrics.observe_swap_out(LLAMA, "g", reason="Idle", seconds=1, bytes_moved=1, idle_seconds=1)
    metrics.observe_load(LLAMA, 1)
    metrics.observe_unload(LLAMA, 1)
    unit = re.compile(r"_(total|seconds_(bucket|sum|count)|bytes|blocks|state)$")
    samples = {
        s.name
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")  # prometheus_client's creation timestamps
    }
    assert len(samples) >= 30
    for name in samples:
        assert name.startswith("modelswap_"), name
        assert unit.search(name), f"{name} does not end in its unit"


@pytest.mark.asyncio
async def test_the_metrics_port_serves_the_text_format() -> None:
    registry, metrics, _ = fresh()
    metrics.triton_restarts.inc(2)
    async with TestClient(TestServer(metrics_app(registry), host="127.0.0.1")) as client:
        response = await client.get("/metrics")
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(await response.text())}
    (sample,) = families["modelswap_triton_restarts"].samples
    assert (sample.name, sample.value) == ("modelswap_triton_restarts_total", 2)
