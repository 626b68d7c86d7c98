"""Runs of a scenario: each policy at a GPU count, and the fewest GPUs meeting the target.

The fewest GPUs are found by bisection between a lower bound no policy can beat (the
trace's mean busy slots over the GPU's slots; the host store's capacity; one GPU) and the
scenario's `maxGpus` (default: one GPU per model), assuming that more GPUs never make the
p99 worse. Every run is kept, so the report shows the curve the search walked.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Callable, Sequence

from modelswap_api.policy import EffectivePolicy
from modelswap_sidecar.policy.kv import host_bytes_needed
from modelswap_sidecar.simulate.catalogue import resolve_policies
from modelswap_sidecar.simulate.engine import RunResult, run
from modelswap_sidecar.simulate.packing import assign
from modelswap_sidecar.simulate.policies import (
    Dedicated,
    LeastRecentlyUsed,
    Modelswap,
    SimPolicy,
)
from modelswap_sidecar.simulate.report import PolicyOutcome, RunSummary, dense_waits, summarize
from modelswap_sidecar.simulate.scenario import PolicySpec, Scenario, policy_settings
from modelswap_sidecar.simulate.traces import Trace
from modelswap_sidecar.simulate.workingset import over_budget_arrivals


def build_policy(spec: PolicySpec, scenario: Scenario) -> SimPolicy:
    shape = scenario.gpu
    if spec.kind == "modelswap":
        return Modelswap(spec.name, shape, policy_settings(spec, shape))
    if spec.kind == "dedicated":
        return Dedicated(spec.name, shape)
    if spec.kind == "keepalive":
        return LeastRecentlyUsed(
            spec.name, shape, kind="keepalive", idle_after_seconds=spec.idle_after_seconds
        )
    if spec.kind == "lru":
        return LeastRecentlyUsed(spec.name, shape, kind="lru")
    return LeastRecentlyUsed(
        spec.name,
        shape,
        kind="sleepwake",
        warm_bytes_per_second=spec.bytes_per_second,
        wake_fixed_seconds=spec.wake_fixed_seconds,
    )


class Study:
    """One scenario and one trace; runs are cheap to ask for, expensive to make."""

    def __init__(self, scenario: Scenario, trace: Trace) -> None:
        self.scenario = scenario
        self.trace = trace
        models = scenario.models
        loads = [0.0] * len(models)
        for m, i, o in zip(trace.model_index, trace.input_tokens, trace.output_tokens, strict=True):
            loads[m] += models[m].service_seconds(i, o)
        self.loads = loads
        self.warm_order = sorted(range(len(models)), key=lambda i: (-loads[i], i))
        busy = sum(loads) / max(trace.duration_seconds, 1e-9)
        self.compute_bound_gpus = max(1, math.ceil(busy / scenario.gpu.concurrent_requests))
        self._reference: array[float] | None = None
        self.reference_summary: RunSummary | None = None

    def reference(self) -> array[float]:
        """Every request's wait in the dedicated run (one GPU per model): the floor that
        added latency is measured from. Run once per study."""
        if self._reference is None:
            spec = PolicySpec(name="dedicated", kind="dedicated", overrides={}, settings={})
            result = self.run(spec, len(self.scenario.models))
            assert result is not None  # one model per GPU always places
            self._reference = dense_waits(result)
            self.reference_summary = summarize(result, self.scenario.target_p99_seconds)
        return self._reference

    def effective(self, spec: PolicySpec) -> tuple[EffectivePolicy, ...]:
        return resolve_policies(self.scenario.models, spec.overrides)

    def run(self, spec: PolicySpec, gpus: int) -> RunResult | None:
        """One run on `gpus` GPUs; None when the models cannot be placed on that many."""
        policy = build_policy(spec, self.scenario)
        if policy.dedicated:
            gpus = len(self.scenario.models)
        assignment = self._placement(spec, policy, gpus)
        if assignment is None:
            return None
        return run(
            self.trace, self.scenario.models, self.effective(spec), policy,
            assignment=assignment, gpus=gpus, warm_order=self.warm_order,
        )  # fmt: skip

    def compute_floor(self, spec: PolicySpec, gpus: int) -> RunResult | None:
        """`run` with the same placement, but HBM enough for every model at once: all stay
        resident and nothing swaps, so every wait is for a compute slot shared with the
        GPU's other models. What sharing slots alone adds on this placement; swaps come
        on top of it. None when the models cannot be placed on that many GPUs."""
        policy = build_policy(spec, self.scenario)
        assignment = self._placement(spec, policy, gpus)
        if assignment is None:
            return None
        shape = self.scenario.gpu
        models = self.scenario.models
        everything = (
            shape.reserve_bytes
            + sum(m.hbm_bytes + shape.per_process_overhead_bytes for m in models)
        )  # fmt: skip
        roomy = dataclasses.replace(
            self.scenario, gpu=dataclasses.replace(shape, hbm_bytes=everything)
        )
        return run(
            self.trace, models, self.effective(spec), build_policy(spec, roomy),
            assignment=assignment, gpus=gpus, warm_order=self.warm_order,
        )  # fmt: skip

    def over_budget_arrivals(
        self, spec: PolicySpec, gpus: int, *, pooled: bool = False
    ) -> float | None:
        """The share of requests that arrive while the busy models of their GPU (in the
        dedicated run's timing, their own model included) need more HBM than the GPU has
        for models (`workingset`): on this placement, no policy that lets requests finish
        serves those without some request waiting for another model's to end. `pooled`:
        all GPUs taken as one, their budgets added (what no placement can beat). None
        when the models cannot be placed on that many GPUs."""
        policy = build_policy(spec, self.scenario)
        assignment = self._placement(spec, policy, gpus)
        if assignment is None:
            return None
        models = self.scenario.models
        hosted = [0] * gpus
        for g in assignment:
            hosted[g] += 1
        budgets = [policy.budget_bytes(n) for n in hosted]
        overhead = policy.loaded_overhead_bytes()
        trace = self.trace
        tokens = zip(trace.model_index, trace.input_tokens, trace.output_tokens, strict=True)
        service = [models[m].service_seconds(i, o) for m, i, o in tokens]
        over = over_budget_arrivals(
            trace,
            service_seconds=service,
            waits_seconds=self.reference(),
            model_bytes=[m.hbm_bytes + overhead for m in models],
            assignment=[0] * len(models) if pooled else assignment,
            budget_bytes=budgets if not pooled else [sum(budgets)],
        )
        return over / len(trace) if len(trace) else 0.0

    def _placement(self, spec: PolicySpec, policy: SimPolicy, gpus: int) -> list[int] | None:
        models = self.scenario.models
        if policy.dedicated:
            return list(range(len(models)))
        effective = self.effective(spec)
        host = [
            _host_bytes(policy, p, m.weights_bytes, m.kv_cache_bytes)
            for p, m in zip(effective, models, strict=True)
        ]
        return assign(
            [m.hbm_bytes for m in models],
            host,
            [p.pinned for p in effective],
            self.loads,
            gpus,
            budget_bytes=policy.budget_bytes,
            loaded_overhead_bytes=policy.loaded_overhead_bytes(),
            host_store_bytes=self.scenario.gpu.host_store_bytes,
        )

    def fewest_gpus(
        self,
        spec: PolicySpec,
        progress: Callable[[RunSummary], None] | None = None,
    ) -> PolicyOutcome:
        target = self.scenario.target_p99_seconds
        summaries: dict[int, RunSummary] = {}

        def meets(gpus: int) -> bool:
            if gpus not in summaries:
                result = self.run(spec, gpus)
                if result is None:
                    return False
                summary = summarize(result, target, self.reference())
                summaries[summary.gpus] = summary
                if progress is not None:
                    progress(summary)
                gpus = summary.gpus
            return summaries[gpus].meets_target

        kind = build_policy(spec, self.scenario)
        if kind.dedicated:
            fewest = len(self.scenario.models) if meets(len(self.scenario.models)) else None
            return PolicyOutcome(
                policy=spec.name, kind=spec.kind, runs=_ordered(summaries), fewest_gpus=fewest
            )
        high = self.scenario.max_gpus
        low = self._lower_bound(spec) - 1  # fails by construction
        if low >= high or not meets(high):
            return PolicyOutcome(
                policy=spec.name, kind=spec.kind, runs=_ordered(summaries), fewest_gpus=None
            )
        while high - low > 1:
            middle = (low + high) // 2
            if meets(middle):
                high = middle
            else:
                low = middle
        return PolicyOutcome(
            policy=spec.name, kind=spec.kind, runs=_ordered(summaries), fewest_gpus=high
        )

    def _lower_bound(self, spec: PolicySpec) -> int:
        policy = build_policy(spec, self.scenario)
        effective = self.effective(spec)
        host = sum(
            _host_bytes(policy, p, m.weights_bytes, m.kv_cache_bytes)
            for p, m in zip(effective, self.scenario.models, strict=True)
        )
        store = self.scenario.gpu.host_store_bytes
        host_bound = math.ceil(host / store) if store else (1 if host == 0 else 10**9)
        return max(1, self.compute_bound_gpus, host_bound)


def _host_bytes(policy: SimPolicy, effective: EffectivePolicy, weights: int, kv: int) -> int:
    """Host-store bytes a model takes under `policy`: the agent's own count for
    modelswap, the weights for sleep/wake, nothing for cold-unloading baselines."""
    if isinstance(policy, Modelswap):
        return host_bytes_needed(effective, weights, kv)
    return weights if policy.keeps_host_copy and not policy.dedicated else 0


def _ordered(summaries: dict[int, RunSummary]) -> tuple[RunSummary, ...]:
    return tuple(summaries[g] for g in sorted(summaries))


def outcomes(
    study: Study,
    specs: Sequence[PolicySpec],
    progress: Callable[[RunSummary], None] | None = None,
) -> list[PolicyOutcome]:
    return [study.fewest_gpus(spec, progress) for spec in specs]
