"""The gateway's Prometheus metrics (served with the agent's on its metrics port).

    modelswap_gateway_requests_total{uid,namespace,model,code}          counter
        every answered request; code is the HTTP status, 499 when the client went away
        (a gRPC answer: the HTTP status its code stands for, `grpc_server`);
        a request naming no known model counts under empty uid/namespace/model
    modelswap_gateway_refusals_total{uid,namespace,model,reason}        counter
        reason QueueFull (429), QueueTimeout (503), SwapInFailed (503)
    modelswap_gateway_queue_wait_seconds{uid,namespace,model,outcome}   histogram
        time in a swap-in queue; outcome released | timeout | failed | cancelled
    modelswap_gateway_swap_ins_triggered_total{uid,namespace,model}     counter
        swap-ins the gateway asked for (one per cold period)
    modelswap_gateway_upstream_lost_total{uid,namespace,model}          counter
        requests Triton's connection broke under after they were sent (Triton died or
        restarted while it held them: a request's inputs may have crashed it)
    modelswap_gateway_queue_depth_requests{uid,namespace,model}         gauge, read at scrape
    modelswap_gateway_in_flight_requests                                gauge, read at scrape

Every collector takes the registry it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from modelswap_sidecar.gateway.connections import (
    CAPS,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_ADDRESS,
    ConnectionLimiter,
)
from modelswap_sidecar.gateway.directory import ModelRoute

MODEL_LABELS = ("uid", "namespace", "model")
WAIT_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

DepthProvider = Callable[[], Iterable[tuple[ModelRoute, int]]]


def _labels(route: ModelRoute | None) -> tuple[str, str, str]:
    return ("", "", "") if route is None else (route.uid, route.namespace, route.name)


class GatewayMetrics:
    """Counters the gateway bumps; also the queues' `QueueObserver`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "modelswap_gateway_requests",
            "Requests answered by the gateway, by model and HTTP status (499: client gone).",
            (*MODEL_LABELS, "code"),
            registry=registry,
        )
        self.refusals = Counter(
            "modelswap_gateway_refusals",
            "Requests refused while a model swapped in (QueueFull, QueueTimeout, SwapInFailed).",
            (*MODEL_LABELS, "reason"),
            registry=registry,
        )
        self.queue_wait = Histogram(
            "modelswap_gateway_queue_wait_seconds",
            "Time requests spent waiting for a swap-in, by how the wait ended.",
            (*MODEL_LABELS, "outcome"),
            buckets=WAIT_SECONDS_BUCKETS,
            registry=registry,
        )
        self.swap_ins_triggered = Counter(
            "modelswap_gateway_swap_ins_triggered",
            "Swap-ins the gateway requested because a request found its model swapped out.",
            MODEL_LABELS,
            registry=registry,
        )
        self.upstream_lost_requests = Counter(
            "modelswap_gateway_upstream_lost",
            "Requests whose connection to Triton broke after they were sent (Triton died or "
            "restarted while it held them).",
            MODEL_LABELS,
            registry=registry,
        )
        #: requests being handled now: a plain count the server keeps, read at scrape time
        #: (a Gauge took a lock twice per request)
        self.in_flight_requests = 0
        registry.register(_InFlightCollector(self))
        # each request's counter, found without building its labels again (`labels` takes
        # a lock and checks every value); as many as the registry holds anyway
        self._answered: dict[tuple[str, str, str, int], Counter] = {}

    def register_queue_depth(self, provider: DepthProvider) -> None:
        self.registry.register(QueueDepthCollector(provider))

    def answered(self, route: ModelRoute | None, code: int) -> None:
        labels = _labels(route)
        key = (*labels, code)
        child = self._answered.get(key)
        if child is None:
            child = self._answered[key] = self.requests.labels(*labels, str(code))
        child.inc()

    def upstream_lost(self, route: ModelRoute) -> None:
        self.upstream_lost_requests.labels(*_labels(route)).inc()

    # QueueObserver
    def swap_in_triggered(self, route: ModelRoute) -> None:
        self.swap_ins_triggered.labels(*_labels(route)).inc()

    def refused(self, route: ModelRoute, reason: str) -> None:
        self.refusals.labels(*_labels(route), reason).inc()

    def waited(self, route: ModelRoute, seconds: float, outcome: str) -> None:
        self.queue_wait.labels(*_labels(route), outcome).observe(seconds)


class QueueDepthCollector(Collector):
    """`modelswap_gateway_queue_depth_requests`, read from the queues at scrape time; a model
    with no queue has no series."""

    def __init__(self, provider: DepthProvider) -> None:
        self._provider = provider

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "modelswap_gateway_queue_depth_requests",
            "Requests waiting for their model's swap-in.",
            labels=MODEL_LABELS,
        )
        for route, depth in self._provider():
            family.add_metric(_labels(route), depth)
        yield family


class _InFlightCollector(Collector):
    """`modelswap_gateway_in_flight_requests`, read from the server's count at scrape time."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "modelswap_gateway_in_flight_requests",
            "Requests the gateway is handling now (queued ones included).",
            value=self._metrics.in_flight_requests,
        )


class ConnectionCollector(Collector):
    """The gateway's connection metrics, read from its limiter at scrape time (none before
    the gateway starts):

        modelswap_gateway_open_connections                    gauge
        modelswap_gateway_max_connections{limit}              gauge: the caps in force
        modelswap_gateway_connections_closed_idle_total{limit}  counter
        modelswap_gateway_connections_refused_total{limit}      counter
    """

    def __init__(self, limiter: Callable[[], ConnectionLimiter | None]) -> None:
        self._limiter = limiter

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterator[Metric]:
        limiter = self._limiter()
        if limiter is None:
            return
        yield GaugeMetricFamily(
            "modelswap_gateway_open_connections",
            "Client connections the gateway holds open (refused ones not yet closed aside).",
            value=limiter.open_connections,
        )
        caps = GaugeMetricFamily(
            "modelswap_gateway_max_connections",
            "The gateway's connection caps: in all, and from one client address.",
            labels=("limit",),
        )
        caps.add_metric([MAX_CONNECTIONS], limiter.caps.max_connections)
        caps.add_metric([MAX_CONNECTIONS_PER_ADDRESS], limiter.caps.max_connections_per_address)
        yield caps
        closed = CounterMetricFamily(
            "modelswap_gateway_connections_closed_idle",
            "Idle client connections the gateway closed to admit new ones at a cap.",
            labels=("limit",),
        )
        refused = CounterMetricFamily(
            "modelswap_gateway_connections_refused",
            "Client connections the gateway refused at a cap with none idle to close.",
            labels=("limit",),
        )
        for cap in CAPS:
            closed.add_metric([cap], limiter.closed_idle[cap])
            refused.add_metric([cap], limiter.refused[cap])
        yield closed
        yield refused
