"""The operator's Prometheus metrics (`modelswap_operator_*`), on its own registry.

Every collector takes the registry it is given, so tests read values from a fresh
`CollectorRegistry` with `get_sample_value`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.turns = Counter(
            "modelswap_operator_reconcile_turns",
            "Turns of the planner loop (one plan, pushes and status writes each).",
            registry=registry,
        )
        self.turn_seconds = Histogram(
            "modelswap_operator_reconcile_duration_seconds",
            "One turn of the planner loop, from snapshot to the last status write.",
            buckets=_SECONDS_BUCKETS,
            registry=registry,
        )
        self.plan_seconds = Histogram(
            "modelswap_operator_plan_duration_seconds",
            "The pure planner's time for one plan.",
            buckets=_SECONDS_BUCKETS,
            registry=registry,
        )
        self.pushes = Counter(
            "modelswap_operator_pushes",
            "Desired-set pushes to node agents, by outcome (ok, unreachable, untrusted, refused).",
            ("outcome",),
            registry=registry,
        )
        self.entry_results = Counter(
            "modelswap_operator_entry_results",
            "Per-entry answers of the agents to pushes (applied, deferred, stale, conflict).",
            ("outcome",),
            registry=registry,
        )
        self.status_writes = Counter(
            "modelswap_operator_status_writes",
            "ModelDeployment status patches (one per object per turn at most).",
            ("outcome",),
            registry=registry,
        )
        self.kube_calls = Counter(
            "modelswap_operator_kube_calls",
            "Kubernetes API calls by helper and outcome (ok, or the HTTP status).",
            ("call", "outcome"),
            registry=registry,
        )
        self.models = Gauge(
            "modelswap_operator_models",
            "ModelDeployments known, by whether they are placed.",
            ("placed",),
            registry=registry,
        )
        self.nodes = Gauge(
            "modelswap_operator_nodes",
            "SwapNodes known, by liveness of their Lease.",
            ("live",),
            registry=registry,
        )
        self.leader = Gauge(
            "modelswap_operator_leader",
            "1 while this process holds the leader Lease.",
            registry=registry,
        )
