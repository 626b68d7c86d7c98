"""The agent's Prometheus metrics, on their own port.

Counted (the agent calls `NodeMetrics.observe_*` as things happen):

    modelswap_swap_ins_total{uid,namespace,model}                   counter
    modelswap_swap_outs_total{uid,namespace,model,reason}           counter
    modelswap_swap_in_duration_seconds{uid,namespace,model}         histogram (cache-miss wait)
    modelswap_swap_out_duration_seconds{uid,namespace,model}        histogram
    modelswap_swap_bytes_total{gpu,direction}                       counter (direction in|out)
    modelswap_eviction_age_seconds{reason}                          histogram (idle at swap-out)
    modelswap_load_duration_seconds{uid,namespace,model}            histogram (load from the source)
    modelswap_unload_duration_seconds{uid,namespace,model}          histogram
    modelswap_triton_restarts_total                                 counter
    modelswap_agent_event_loop_lag_seconds                          histogram (`agent.loop_lag`)
    modelswap_source_cache_hits_total / _misses_total               counters

Read at scrape time from a provider callable (state, not events):

    modelswap_hbm_total_bytes / _reserved_bytes / _overhead_bytes / _used_bytes {gpu}
    modelswap_host_store_bytes / modelswap_host_store_capacity_bytes {gpu}
    modelswap_model_state{uid,namespace,model,state}                1 for the current state, 0 else
    modelswap_model_resident_bytes / modelswap_model_host_bytes {uid,namespace,model}
    modelswap_kv_blocks{uid,namespace,model,tier}                   tier device|host
    modelswap_kv_session_hits_total / _misses_total / _evictions_total {uid,namespace,model}
    modelswap_kv_tokens_reused_total / _recomputed_total {uid,namespace,model}
      (the KV figures are what the model processes' session stores report with their
      heartbeats, `modelswap_client.kv_sessions`; counters restart with the process)

Measured once at start (cuda-vmm's link probe; `register_link_metrics`):

    modelswap_gpu_link_bytes_per_second{gpu,kind,direction}         direction h2d|d2h

Every metric takes the registry it is given, so tests use a fresh `CollectorRegistry()`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from modelswap_sidecar.engine.states import EngineState

logger = logging.getLogger(__name__)

MODEL_LABELS = ("uid", "namespace", "model")
SWAP_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LOAD_SECONDS_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: from 2.5 ms: uvloop fires timers on whole milliseconds, so up to 1 ms late is its rhythm
LAG_SECONDS_BUCKETS = (0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
AGE_SECONDS_BUCKETS = (60.0, 300.0, 600.0, 1800.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0)


@dataclass(frozen=True, kw_only=True)
class ModelLabels:
    uid: str
    namespace: str
    name: str

    def values(self) -> tuple[str, str, str]:
        return (self.uid, self.namespace, self.name)


@dataclass(frozen=True, kw_only=True)
class GpuSample:
    gpu: str
    total_bytes: int
    reserved_bytes: int
    overhead_bytes: int
    used_bytes: int
    host_store_bytes: int
    host_store_capacity_bytes: int


@dataclass(frozen=True, kw_only=True)
class ModelSample:
    model: ModelLabels
    state: str  # an EngineState value
    resident_bytes: int
    host_bytes: int
    kv_device_blocks: int = 0
    kv_host_blocks: int = 0
    kv_hits: int = 0
    kv_misses: int = 0
    kv_evictions: int = 0
    kv_tokens_reused: int = 0
    kv_tokens_recomputed: int = 0


@dataclass(frozen=True, kw_only=True)
class NodeSample:
    gpus: Sequence[GpuSample] = ()
    models: Sequence[ModelSample] = ()


StateProvider = Callable[[], NodeSample]


class NodeMetrics:
    def __init__(self, registry: CollectorRegistry, state: StateProvider) -> None:
        self.registry = registry
        self.swap_ins = Counter(
            "modelswap_swap_ins", "Swap-ins completed.", MODEL_LABELS, registry=registry
        )
        self.swap_outs = Counter(
            "modelswap_swap_outs",
            "Swap-outs completed, by why (Idle, Pressure, MakeRoom, Manual, Unload).",
            (*MODEL_LABELS, "reason"),
            registry=registry,
        )
        self.swap_in_seconds = Histogram(
            "modelswap_swap_in_duration_seconds",
            "Time from the decision to swap in until the model serves again.",
            MODEL_LABELS,
            buckets=SWAP_SECONDS_BUCKETS,
            registry=registry,
        )
        self.swap_out_seconds = Histogram(
            "modelswap_swap_out_duration_seconds",
            "Time to drain, save and unmap a model.",
            MODEL_LABELS,
            buckets=SWAP_SECONDS_BUCKETS,
            registry=registry,
        )
        self.swap_bytes = Counter(
            "modelswap_swap_bytes",
            "Bytes copied between HBM and the host store.",
            ("gpu", "direction"),
            registry=registry,
        )
        self.eviction_age = Histogram(
            "modelswap_eviction_age_seconds",
            "How long a model had been idle when it was swapped out.",
            ("reason",),
            buckets=AGE_SECONDS_BUCKETS,
            registry=registry,
        )
        self.load_seconds = Histogram(
            "modelswap_load_duration_seconds",
            "Time to load a model into the runtime from its source or the host store.",
            MODEL_LABELS,
            buckets=LOAD_SECONDS_BUCKETS,
            registry=registry,
        )
        self.unload_seconds = Histogram(
            "modelswap_unload_duration_seconds",
            "Time to unload a model from the runtime.",
            MODEL_LABELS,
            buckets=LOAD_SECONDS_BUCKETS,
            registry=registry,
        )
        self.triton_restarts = Counter(
            "modelswap_triton_restarts", "Restarts of tritonserver.", registry=registry
        )
        self.loop_lag = Histogram(
            "modelswap_agent_event_loop_lag_seconds",
            "How late the agent's event loop ran a timer: every gateway request and control "
            "call of that moment waited as long.",
            buckets=LAG_SECONDS_BUCKETS,
            registry=registry,
        )
        self.source_cache_hits = Counter(
            "modelswap_source_cache_hits",
            "Model sources served from the node-local cache.",
            registry=registry,
        )
        self.source_cache_misses = Counter(
            "modelswap_source_cache_misses",
            "Model sources fetched because the cache lacked them.",
            registry=registry,
        )
        self._per_model = (
            self.swap_ins,
            self.swap_in_seconds,
            self.swap_out_seconds,
            self.load_seconds,
            self.unload_seconds,
        )
        registry.register(StateCollector(state))

    def observe_swap_in(
        self, model: ModelLabels, gpu: str, seconds: float, bytes_moved: int
    ) -> None:
        self.swap_ins.labels(*model.values()).inc()
        self.swap_in_seconds.labels(*model.values()).observe(seconds)
        self.swap_bytes.labels(gpu, "in").inc(bytes_moved)

    def observe_swap_out(
        self,
        model: ModelLabels,
        gpu: str,
        *,
        reason: str,
        seconds: float,
        bytes_moved: int,
        idle_seconds: float,
    ) -> None:
        self.swap_outs.labels(*model.values(), reason).inc()
        self.swap_out_seconds.labels(*model.values()).observe(seconds)
        self.swap_bytes.labels(gpu, "out").inc(bytes_moved)
        self.eviction_age.labels(reason).observe(idle_seconds)

    def observe_load(self, model: ModelLabels, seconds: float) -> None:
        self.load_seconds.labels(*model.values()).observe(seconds)

    def observe_unload(self, model: ModelLabels, seconds: float) -> None:
        self.unload_seconds.labels(*model.values()).observe(seconds)

    def forget_model(self, model: ModelLabels) -> None:
        """Drop a deleted model's series, so a node does not report it forever."""
        for metric in self._per_model:
            with contextlib.suppress(KeyError):
                metric.remove(*model.values())
        for labels in list(_label_sets(self.swap_outs)):
            if labels[: len(MODEL_LABELS)] == model.values():
                self.swap_outs.remove(*labels)


def _label_sets(metric: Counter) -> Iterable[tuple[str, ...]]:
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                yield tuple(sample.labels[name] for name in (*MODEL_LABELS, "reason"))


class StateCollector(Collector):
    """HBM, host store, model states and KV blocks, read from the provider at scrape time.

    A provider that fails makes these families empty for that scrape (and is logged); the
    counted metrics are still served.
    """

    def __init__(self, state: StateProvider) -> None:
        self._state = state

    def describe(self) -> Iterable[Metric]:
        return ()  # read at scrape time: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        try:
            sample = self._state()
        except Exception:
            logger.warning("metrics state provider failed", exc_info=True)
            return
        yield from _gpu_families(sample.gpus)
        yield from _model_families(sample.models)


def _gpu_families(gpus: Sequence[GpuSample]) -> Iterator[Metric]:
    fields = [
        ("modelswap_hbm_total_bytes", "GPU memory in total.", "total_bytes"),
        (
            "modelswap_hbm_reserved_bytes",
            "GPU memory kept back by configuration.",
            "reserved_bytes",
        ),
        (
            "modelswap_hbm_overhead_bytes",
            "GPU memory held by runtime processes themselves (contexts, workspaces).",
            "overhead_bytes",
        ),
        ("modelswap_hbm_used_bytes", "GPU memory charged to models.", "used_bytes"),
        ("modelswap_host_store_bytes", "Host-store bytes in use.", "host_store_bytes"),
        (
            "modelswap_host_store_capacity_bytes",
            "Host-store capacity.",
            "host_store_capacity_bytes",
        ),
    ]
    for name, documentation, attribute in fields:
        family = GaugeMetricFamily(name, documentation, labels=("gpu",))
        for gpu in gpus:
            family.add_metric((gpu.gpu,), getattr(gpu, attribute))
        yield family


def _model_families(models: Sequence[ModelSample]) -> Iterator[Metric]:
    state = GaugeMetricFamily(
        "modelswap_model_state",
        "1 for the engine state each model is in, 0 for the others.",
        labels=(*MODEL_LABELS, "state"),
    )
    resident = GaugeMetricFamily(
        "modelswap_model_resident_bytes", "HBM bytes a model holds.", labels=MODEL_LABELS
    )
    host = GaugeMetricFamily(
        "modelswap_model_host_bytes", "Host-store bytes a model holds.", labels=MODEL_LABELS
    )
    kv = GaugeMetricFamily(
        "modelswap_kv_blocks",
        "KV-cache blocks of a model by tier (device, host).",
        labels=(*MODEL_LABELS, "tier"),
    )
    kv_counters = [
        (
            CounterMetricFamily(name, documentation, labels=MODEL_LABELS),
            attribute,
        )
        for name, documentation, attribute in (
            (
                "modelswap_kv_session_hits_total",
                "Turns that found their session's KV cache with its prefix intact.",
                "kv_hits",
            ),
            (
                "modelswap_kv_session_misses_total",
                "Turns without a KV cache (new or evicted session) or whose bytes were lost.",
                "kv_misses",
            ),
            (
                "modelswap_kv_session_evictions_total",
                "Sessions evicted from the KV tiers (whole, or their host blocks).",
                "kv_evictions",
            ),
            (
                "modelswap_kv_tokens_reused_total",
                "Prefix tokens whose cached K/V a turn used instead of computing them.",
                "kv_tokens_reused",
            ),
            (
                "modelswap_kv_tokens_recomputed_total",
                "Cached tokens computed again because their K/V was lost (discard, eviction).",
                "kv_tokens_recomputed",
            ),
        )
    ]
    known = [s.value for s in EngineState]
    for model in models:
        labels = model.model.values()
        for name in known if model.state in known else [*known, model.state]:
            state.add_metric((*labels, name), 1.0 if name == model.state else 0.0)
        resident.add_metric(labels, model.resident_bytes)
        host.add_metric(labels, model.host_bytes)
        kv.add_metric((*labels, "device"), model.kv_device_blocks)
        kv.add_metric((*labels, "host"), model.kv_host_blocks)
        for family, attribute in kv_counters:
            family.add_metric(labels, getattr(model, attribute))
    yield from (state, resident, host, kv)
    yield from (family for family, _ in kv_counters)


def metrics_app(registry: CollectorRegistry) -> web.Application:
    """`GET /metrics` in the Prometheus text format, for the agent's metrics port."""

    async def serve(request: web.Request) -> web.Response:
        del request
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application()
    app.router.add_get("/metrics", serve)
    return app


def register_link_metrics(
    registry: CollectorRegistry, gpus: Sequence[str], links: Sequence[Any]
) -> None:
    """Each GPU's probed host link (`modelswap_api.models.Link`: kind, GB/s each way), in
    bytes per second. GPUs without figures (sim without a configured rate, a failed probe)
    get no sample."""
    gauge = Gauge(
        "modelswap_gpu_link_bytes_per_second",
        "Host-GPU copy rate measured at agent start (pinned copies, link probe).",
        ("gpu", "kind", "direction"),
        registry=registry,
    )
    for uuid, link in zip(gpus, links, strict=True):
        for direction, gbps in (
            ("h2d", link.host_to_device_gbps),
            ("d2h", link.device_to_host_gbps),
        ):
            if gbps is not None:
                gauge.labels(uuid, link.kind or "unknown", direction).set(gbps * 1e9)
