"""The twin check's pure parts: what a real local-mode run recorded, that record turned into
the simulator's inputs and replayed, and the verdict comparing the two (issue 14,
deliverable 7). `bench/twin.py` makes the records (side effects); nothing here does I/O.

A record holds every request's arrival (when it was sent, seconds from the run's start),
its model and latency; each model's mean service time (Triton's own compute statistics
over the run); the models resident when the run started; and the agent's swap counts and
swap-in durations over the run. The replay runs `modelswap_sidecar.simulate.engine` with
the agent's policy module and the agent's own policy settings (watermarks only), one GPU
shaped like the node's sim GPU (HBM, reserve, per-process overhead from `GET /v1/node`,
the link = the pace), the recorded arrivals, and each request's service time.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelswap_sidecar.policy.inputs import PolicySettings
from modelswap_sidecar.simulate.catalogue import CatalogueModel, resolve_policies
from modelswap_sidecar.simulate.engine import RunResult, run
from modelswap_sidecar.simulate.gpu import GpuShape
from modelswap_sidecar.simulate.policies import Modelswap
from modelswap_sidecar.simulate.traces import Trace

#: the trace's token unit: a request's service time is `output_tokens` microseconds
SECONDS_PER_TOKEN = 1e-6
#: issue 14: median swap-in latencies agree within max(20 %, 20 ms)
LATENCY_RELATIVE_TOLERANCE = 0.20
LATENCY_ABSOLUTE_TOLERANCE_SECONDS = 0.020


@dataclass(frozen=True, kw_only=True)
class Request:
    model: str
    #: when it was sent, seconds from the run's start
    arrival_seconds: float
    latency_seconds: float
    #: answered 200 with the reference answer
    correct: bool


@dataclass(frozen=True, kw_only=True)
class NodeShape:
    """The node's one sim GPU, as the agent reports it, and what the replay charges."""

    hbm_bytes: int
    reserve_bytes: int
    per_process_overhead_bytes: int
    pace_bytes_per_second: float
    #: the engine's cost of a swap-in beside the copy and of a swap-out, measured on the
    #: node before the compared runs (bench/twin.py: `calibrate`)
    swap_in_fixed_seconds: float
    swap_out_fixed_seconds: float
    high_watermark_fraction: float = 0.95
    low_watermark_fraction: float = 0.85


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    #: every model the node serves, in a fixed order (the catalogue's)
    models: tuple[str, ...]
    weights_bytes: int
    #: the ModelDeployments' spec sections (wire form), the same for every model
    spec: Mapping[str, Any]
    resident_at_start: tuple[str, ...]
    requests: tuple[Request, ...]
    #: per model, the mean service time of its requests (seconds)
    service_seconds: Mapping[str, float]
    duration_seconds: float
    swap_ins: int
    swap_outs: int
    #: the agent's swap-in durations seen over the run (may be fewer than `swap_ins`)
    swap_in_seconds: tuple[float, ...]
    #: (seconds from the start, model, "in" | "out") of each swap seen, for diagnosis
    swap_events: tuple[tuple[float, str, str], ...] = ()


def to_trace(record: RunRecord) -> Trace:
    """The record's requests as a simulator trace, sorted by arrival: model indices into
    `record.models`, no input tokens, each request's service time in output tokens of
    `SECONDS_PER_TOKEN` (at least one)."""
    index = {name: i for i, name in enumerate(record.models)}
    ordered = sorted(record.requests, key=lambda r: (r.arrival_seconds, index[r.model]))
    return Trace(
        arrival_seconds=[r.arrival_seconds for r in ordered],
        model_index=[index[r.model] for r in ordered],
        input_tokens=[0] * len(ordered),
        output_tokens=[
            max(1, round(record.service_seconds[r.model] / SECONDS_PER_TOKEN)) for r in ordered
        ],
        duration_seconds=record.duration_seconds,
    )


def catalogue(record: RunRecord) -> tuple[CatalogueModel, ...]:
    return tuple(
        CatalogueModel(
            name=name,
            weights_bytes=record.weights_bytes,
            per_output_token_seconds=SECONDS_PER_TOKEN,
            spec=record.spec,
        )
        for name in record.models
    )


def gpu_shape(node: NodeShape, models: int) -> GpuShape:
    """One GPU like the node's; every link is the pace (a swap-out copies nothing, and no
    model loads cold during a run). One compute slot per model: each model is one Triton
    instance that serves its requests one at a time."""
    return GpuShape(
        hbm_bytes=node.hbm_bytes,
        reserve_bytes=node.reserve_bytes,
        per_process_overhead_bytes=node.per_process_overhead_bytes,
        host_store_bytes=1 << 62,
        host_to_device_bytes_per_second=node.pace_bytes_per_second,
        device_to_host_bytes_per_second=node.pace_bytes_per_second,
        cold_load_bytes_per_second=node.pace_bytes_per_second,
        cold_start_seconds=0.0,
        swap_in_fixed_seconds=node.swap_in_fixed_seconds,
        swap_out_fixed_seconds=node.swap_out_fixed_seconds,
        concurrent_requests=models,
    )


def replay(record: RunRecord, node: NodeShape) -> RunResult:
    """The record through the simulator: the agent's policy with the agent's settings, the
    models resident at the run's start warm, the others swapped out (in the host store)."""
    models = catalogue(record)
    shape = gpu_shape(node, len(models))
    settings = PolicySettings(
        high_watermark_fraction=node.high_watermark_fraction,
        low_watermark_fraction=node.low_watermark_fraction,
    )
    resident = set(record.resident_at_start)
    warm = [i for i, m in enumerate(record.models) if m in resident]
    return run(
        to_trace(record),
        models,
        resolve_policies(models, {}),
        Modelswap("modelswap", shape, settings),
        assignment=[0] * len(models),
        gpus=1,
        warm_order=warm,
    )


def latency_agrees(real_seconds: float, sim_seconds: float) -> bool:
    tolerance = max(LATENCY_RELATIVE_TOLERANCE * real_seconds, LATENCY_ABSOLUTE_TOLERANCE_SECONDS)
    return abs(real_seconds - sim_seconds) <= tolerance


def _median(samples: Sequence[float]) -> float | None:
    return statistics.median(samples) if samples else None


def verdict(records: Sequence[RunRecord], replays: Sequence[RunResult]) -> dict[str, Any]:
    """Issue 14's pass conditions over paired runs: swap counts equal in every run, and the
    median swap-in latency over all runs (every sample pooled) within max(20 %, 20 ms) of
    the real one."""
    runs = []
    for record, sim in zip(records, replays, strict=True):
        runs.append(
            {
                "real_swap_ins": record.swap_ins,
                "sim_swap_ins": sim.swap_ins,
                "real_swap_outs": record.swap_outs,
                "sim_swap_outs": sim.swap_outs,
                "sim_cold_loads": sim.cold_loads,
                "swap_counts_match": (
                    record.swap_ins == sim.swap_ins
                    and record.swap_outs == sim.swap_outs
                    and sim.cold_loads == 0
                ),
                "real_median_swap_in_seconds": _median(record.swap_in_seconds),
                "sim_median_swap_in_seconds": _median(sim.swap_in_seconds),
                "requests": len(record.requests),
                "correct": sum(r.correct for r in record.requests),
                "sim_unserved": len(sim.unserved_requests),
            }
        )
    real = _median([s for r in records for s in r.swap_in_seconds])
    sim = _median([s for r in replays for s in r.swap_in_seconds])
    latency_ok = real is not None and sim is not None and latency_agrees(real, sim)
    counts_ok = bool(runs) and all(r["swap_counts_match"] for r in runs)
    return {
        "runs": runs,
        "swap_counts_match": counts_ok,
        "real_median_swap_in_seconds": real,
        "sim_median_swap_in_seconds": sim,
        "swap_in_latency_within_tolerance": latency_ok,
        "met": counts_ok and latency_ok,
    }
