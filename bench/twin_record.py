"""The twin check's pure parts: what a real local-mode run recorded, that record turned into
the simulator's inputs and replayed, and the verdict comparing the two (issue 14,
deliverable 7). `bench/twin.py` makes the records (side effects); nothing here does I/O.

A record holds every request's send time (seconds from the run's start), model, latency,
when the gateway received it (`X-Modelswap-Received-At`) and its wait there for its
model's swap-in (`X-Modelswap-Queue-Wait-Seconds`); the
models resident when the run started; the agent's swap counts; and every swap the agent
was seen to make (polled), each swap-in with the engine's own duration.

Each record is replayed twice through `modelswap_sidecar.simulate.engine`, both times with
the agent's policy module and settings (watermarks only), one GPU shaped like the node's
sim GPU (HBM, reserve, per-process overhead from `GET /v1/node`, link = the pace), each
request arriving when the gateway received it, in that order (the order the agent saw
them in), and served for its own service time (from the end of its wait to its answer):

- `predict`: every swap costs what the calibration measured before the run (fixed costs
  plus bytes over the link). An independent prediction: the latency check compares its
  swap-in durations with the real ones.
- `follow`: every swap-in costs what the real one did (`swap_in_ends`): the replay's n-th
  swap-in of a model ends when the real n-th one did, as the gateway saw it, or its
  recorded duration after the replay admitted it, whichever is later; swap-outs are
  inside it (the engine swaps victims out within its swap-in). What is left to the
  simulator is what it decides: admissions, victims, the order of waiting models. The
  count check compares its swap counts with the real ones; `first_divergence` says where
  a run's sequences part.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from modelswap_sidecar.policy.inputs import PolicySettings, Residency
from modelswap_sidecar.simulate.catalogue import CatalogueModel, resolve_policies
from modelswap_sidecar.simulate.engine import RunResult, run
from modelswap_sidecar.simulate.gpu import GpuShape
from modelswap_sidecar.simulate.policies import Decision, Modelswap, Transfer
from modelswap_sidecar.simulate.state import GpuState, ModelState
from modelswap_sidecar.simulate.traces import Trace

#: the trace's token unit: a request's service time is `output_tokens` microseconds
SECONDS_PER_TOKEN = 1e-6
#: issue 14: median swap-in latencies agree within max(20 %, 20 ms)
LATENCY_RELATIVE_TOLERANCE = 0.20
LATENCY_ABSOLUTE_TOLERANCE_SECONDS = 0.020

Mode = Literal["predict", "follow"]


@dataclass(frozen=True, kw_only=True)
class Request:
    model: str
    #: when it was sent, seconds from the run's start
    arrival_seconds: float
    latency_seconds: float
    #: answered 200 with the reference answer
    correct: bool
    #: how long the gateway held it for its model's swap-in (its X-Modelswap-Queue-Wait-
    #: Seconds answer header; 0 when the model was resident)
    queue_wait_seconds: float = 0.0
    #: when the gateway received it (seconds from the run's start, from its
    #: X-Modelswap-Received-At answer header); None: no answer from the gateway
    received_seconds: float | None = None

    @property
    def arrival_at_gateway_seconds(self) -> float:
        """When the agent saw it arrive: its receipt where known, else its send time."""
        return self.arrival_seconds if self.received_seconds is None else self.received_seconds

    @property
    def service_seconds(self) -> float:
        """Its own service time: in flight once its model served it (forwarding, Triton's
        queue and compute, the answer back), from the end of its wait at the gateway to
        its answer: its latency less its way to the gateway and its wait there."""
        answered = self.arrival_seconds + self.latency_seconds
        served_from = self.arrival_at_gateway_seconds + self.queue_wait_seconds
        return max(answered - served_from, SECONDS_PER_TOKEN)


@dataclass(frozen=True, kw_only=True)
class SwapSeen:
    """One swap the agent made, as a poll of `GET /v1/models` saw it."""

    model: str
    kind: Literal["in", "out"]
    #: when the poll saw it (seconds from the run's start): at or after it ended
    seen_at_seconds: float
    #: the model's swap-ins (or swap-outs) in this run so far, this one included
    number: int
    #: a swap-in's duration as the engine timed it (from its admission, victims' swap-out
    #: inside); None when a later swap-in of the same model came before the poll
    seconds: float | None = None


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
    duration_seconds: float
    #: the agent's counts over the run (GET /v1/models, before and after)
    swap_ins: int
    swap_outs: int
    #: every swap seen, in the order seen
    swaps: tuple[SwapSeen, ...] = ()
    #: the trace's seed (bench/twin.py's generator)
    seed: int | None = None
    #: per model, Triton's mean compute time (input + infer + output) over the run: not
    #: replayed (each request's own service time is), kept to show the gateway's share
    triton_compute_seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def swap_in_seconds(self) -> tuple[float, ...]:
        """The engine's durations of the swap-ins seen (may be fewer than `swap_ins`)."""
        return tuple(s.seconds for s in self.swaps if s.kind == "in" and s.seconds is not None)


def load_records(data: Mapping[str, Any]) -> tuple[list[NodeShape], list[RunRecord]]:
    """What `python -m bench.twin --record FILE` wrote (its JSON, parsed), back as the node
    shapes and run records it was written from."""
    shapes = [NodeShape(**n) for n in data["nodes"]]
    records = []
    for r in data["runs"]:
        fields = dict(r)
        fields["requests"] = tuple(Request(**q) for q in r["requests"])
        fields["swaps"] = tuple(SwapSeen(**s) for s in r["swaps"])
        for name in ("models", "resident_at_start"):
            fields[name] = tuple(r[name])
        records.append(RunRecord(**fields))
    return shapes, records


def to_trace(record: RunRecord) -> Trace:
    """The record's requests as a simulator trace, each arriving when the gateway received
    it, in that order: model indices into `record.models`, no input tokens, each request's
    own service time in output tokens of `SECONDS_PER_TOKEN` (at least one)."""
    index = {name: i for i, name in enumerate(record.models)}
    ordered = sorted(record.requests, key=lambda r: (r.arrival_at_gateway_seconds, index[r.model]))
    return Trace(
        arrival_seconds=[r.arrival_at_gateway_seconds for r in ordered],
        model_index=[index[r.model] for r in ordered],
        input_tokens=[0] * len(ordered),
        output_tokens=[max(1, round(r.service_seconds / SECONDS_PER_TOKEN)) for r in ordered],
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
    model loads cold during a run). A compute slot per model: each model is one Triton
    instance, and a request holds its slot for its recorded service time."""
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


# -- what the real swaps cost ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RealSwapIn:
    """The n-th swap-in of a model in a real run, as `follow` replays it."""

    #: the engine's duration (None: not seen)
    seconds: float | None
    #: when it ended (None: nothing dates it): no earlier than `waited_until_seconds`, nor
    #: than the end of the swap-in before it on the GPU plus its own duration (admissions
    #: are serial), and no later than the poll that saw it
    ended_at_seconds: float | None
    #: the latest receipt + queue wait of the model's requests that waited for it (None:
    #: none did): the end as the gateway saw it
    waited_until_seconds: float | None = None


def swap_in_ends(record: RunRecord) -> dict[tuple[str, int], RealSwapIn]:
    """(model, n) -> its n-th real swap-in. A request that waited for its model waited for
    the first swap-in of it seen after the gateway received the request (a poll sees a
    swap after it ended; the model is not out again within a poll of coming in); its wait
    ended at its receipt + queue wait, when the gateway saw the swap-in end. The swap-ins
    of one GPU follow one another, so one ended no earlier than the one before it plus its
    own duration."""
    ins = [s for s in record.swaps if s.kind == "in"]
    seen: dict[str, list[SwapSeen]] = defaultdict(list)
    for s in ins:
        seen[s.model].append(s)
    waited: dict[tuple[str, int], float] = {}
    for r in record.requests:
        if r.queue_wait_seconds <= 0:
            continue
        arrived = r.arrival_at_gateway_seconds
        swap = next((s for s in seen[r.model] if s.seen_at_seconds > arrived), None)
        if swap is not None:
            key = (r.model, swap.number)
            end = arrived + r.queue_wait_seconds
            waited[key] = max(waited.get(key, end), end)
    out = {}
    previous: float | None = None
    for s in ins:  # in the order seen: the GPU's order
        key = (s.model, s.number)
        bounds = [waited[key]] if key in waited else []
        if previous is not None and s.seconds is not None:
            bounds.append(previous + s.seconds)
        end = min(max(bounds), s.seen_at_seconds) if bounds else None
        out[key] = RealSwapIn(
            seconds=s.seconds, ended_at_seconds=end, waited_until_seconds=waited.get(key)
        )
        previous = end
    return out


# -- the replays -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Admitted:
    """One admission the replay made: when, which model, its victims, and each resident
    model's last mark then (the later of its last request and its swap-in; None while it
    has requests in flight), which the victim score ranks."""

    at_seconds: float
    model: str
    victims: tuple[str, ...]
    marks: Mapping[str, float | None]
    #: a victim still had requests in flight (the replay's swap-in starts after they end)
    drained: bool


class TwinPolicy(Modelswap):
    """The agent's policy (`Modelswap`), logging its admissions; with `real` (`follow`),
    each swap-in costs what the real one did."""

    def __init__(
        self,
        shape: GpuShape,
        settings: PolicySettings,
        real: Mapping[tuple[str, int], RealSwapIn] | None = None,
    ) -> None:
        super().__init__("modelswap", shape, settings)
        self.real = real
        self.admitted: list[Admitted] = []
        #: swap-ins the record has no cost for (charged the calibrated cost instead)
        self.unrecorded = 0
        self._numbers: dict[str, int] = defaultdict(int)

    def admit(self, gpu: GpuState, model: ModelState, now: float) -> Decision:
        decision = super().admit(gpu, model, now)
        if decision.outcome == "admit":
            resident = [m for m in gpu.models if m.residency is Residency.RESIDENT]
            self.admitted.append(
                Admitted(
                    at_seconds=now,
                    model=model.name,
                    victims=tuple(v.name for v in decision.victims),
                    marks={m.name: _mark(m) for m in resident},
                    drained=any(v.running for v in decision.victims),
                )
            )
        return decision

    def swap_in(self, model: ModelState) -> Transfer:
        self._numbers[model.name] += 1
        if self.real is None:
            return super().swap_in(model)
        real = self.real.get((model.name, self._numbers[model.name]))
        if real is None or (real.seconds is None and real.ended_at_seconds is None):
            self.unrecorded += 1
            calibrated = super().swap_in(model)
            # swap-outs are free in `follow` (inside the recorded swap-ins): charge one here
            return Transfer(
                calibrated.fixed_seconds + self.shape.swap_out_fixed_seconds,
                calibrated.bytes,
                calibrated.bytes_per_second,
                calibrated.link,
            )
        # the swap-in starts at its admission (its victims' swap-outs take no time here)
        done = model.admitted_at + (real.seconds or 0.0)
        if real.ended_at_seconds is not None:
            done = max(done, real.ended_at_seconds)
        return Transfer(done - model.admitted_at, 0, 1.0, "none")

    def swap_out(self, model: ModelState) -> Transfer:
        if self.real is None:
            return super().swap_out(model)
        return Transfer(0.0, 0, 1.0, "none")


def _mark(m: ModelState) -> float | None:
    if m.running or m.queued:
        return None
    marks = [t for t in (m.last_request, m.resident_since) if t is not None]
    return max(marks) if marks else None


@dataclass(frozen=True)
class Replay:
    result: RunResult
    admitted: tuple[Admitted, ...]
    unrecorded_swap_ins: int


def replay(record: RunRecord, node: NodeShape, mode: Mode = "predict") -> Replay:
    """The record through the simulator: the agent's policy with the agent's settings, the
    models resident at the run's start warm, the others swapped out (in the host store);
    swaps priced as `mode` says (module docstring)."""
    models = catalogue(record)
    shape = gpu_shape(node, len(models))
    settings = PolicySettings(
        high_watermark_fraction=node.high_watermark_fraction,
        low_watermark_fraction=node.low_watermark_fraction,
    )
    policy = TwinPolicy(shape, settings, swap_in_ends(record) if mode == "follow" else None)
    resident = set(record.resident_at_start)
    warm = [i for i, m in enumerate(record.models) if m in resident]
    result = run(
        to_trace(record),
        models,
        resolve_policies(models, {}),
        policy,
        assignment=[0] * len(models),
        gpus=1,
        warm_order=warm,
    )
    return Replay(result, tuple(policy.admitted), policy.unrecorded)


# -- the verdict -----------------------------------------------------------------------------


def latency_agrees(real_seconds: float, sim_seconds: float) -> bool:
    tolerance = max(LATENCY_RELATIVE_TOLERANCE * real_seconds, LATENCY_ABSOLUTE_TOLERANCE_SECONDS)
    return abs(real_seconds - sim_seconds) <= tolerance


def _median(samples: Sequence[float]) -> float | None:
    return statistics.median(samples) if samples else None


def _counts_match(record: RunRecord, sim: RunResult) -> bool:
    return (
        record.swap_ins == sim.swap_ins
        and record.swap_outs == sim.swap_outs
        and sim.cold_loads == 0
        and not sim.unserved_requests
    )


def verdict(
    records: Sequence[RunRecord],
    followed: Sequence[Replay],
    predicted: Sequence[Replay],
) -> dict[str, Any]:
    """Issue 14's pass conditions over paired runs: swap counts equal in every run (the
    `follow` replay's), and the median swap-in latency over all runs (every sample pooled)
    within max(20 %, 20 ms) of the `predict` replay's."""
    runs = []
    for record, follow, predict in zip(records, followed, predicted, strict=True):
        replayed, guess = follow.result, predict.result
        runs.append(
            {
                "seed": record.seed,
                "real_swap_ins": record.swap_ins,
                "sim_swap_ins": replayed.swap_ins,
                "real_swap_outs": record.swap_outs,
                "sim_swap_outs": replayed.swap_outs,
                "sim_cold_loads": replayed.cold_loads,
                "swap_counts_match": _counts_match(record, replayed),
                "unrecorded_swap_ins": follow.unrecorded_swap_ins,
                "drained_admissions": sum(a.drained for a in follow.admitted),
                "predicted_swap_ins": guess.swap_ins,
                "predicted_swap_outs": guess.swap_outs,
                "real_median_swap_in_seconds": _median(record.swap_in_seconds),
                "sim_median_swap_in_seconds": _median(guess.swap_in_seconds),
                "requests": len(record.requests),
                "correct": sum(r.correct for r in record.requests),
                "sim_unserved": len(replayed.unserved_requests),
            }
        )
    real = _median([s for r in records for s in r.swap_in_seconds])
    sim = _median([s for p in predicted for s in p.result.swap_in_seconds])
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


def _busy_last(mark: tuple[str, float | None]) -> tuple[bool, float, str]:
    name, at = mark
    return (at is None, at or 0.0, name)


@dataclass(frozen=True)
class _RealIn:
    model: str
    seen_at_seconds: float
    #: the models seen going out from the poll that saw the previous swap-in to the one
    #: that saw this one: its victims are among them (a poll that sees a swap-in may
    #: already see the next one's victim out)
    outs: tuple[str, ...]


def _real_ins(record: RunRecord) -> list[_RealIn]:
    ins = [s for s in record.swaps if s.kind == "in"]
    outs = [s for s in record.swaps if s.kind == "out"]
    real = []
    previous = float("-inf")
    for s in ins:
        window = (o.model for o in outs if previous <= o.seen_at_seconds <= s.seen_at_seconds)
        real.append(_RealIn(s.model, s.seen_at_seconds, tuple(sorted(set(window)))))
        previous = s.seen_at_seconds
    return real


def first_divergence(record: RunRecord, replayed: Replay) -> str | None:
    """Where the replay's swap-ins first differ from the real ones (another model, or a
    victim not seen going out around the real one), in words with the resident models'
    marks at the replay's admission; None when they do not differ."""
    real = _real_ins(record)
    for n, admission in enumerate(replayed.admitted):
        if (
            n < len(real)
            and real[n].model == admission.model
            and set(admission.victims) <= set(real[n].outs)
        ):
            continue
        marks = ", ".join(
            f"{name} {'busy' if t is None else f'{t:.3f} s'}"
            for name, t in sorted(admission.marks.items(), key=_busy_last)
        )
        said = _said(real[n]) if n < len(real) else "no real one"
        asked = [admission.model] + (
            [real[n].model] if n < len(real) and real[n].model != admission.model else []
        )
        return (
            f"swap-in {n + 1}: {said}; replayed {admission.model} in place of "
            f"{', '.join(admission.victims) or 'nothing'} (admitted at "
            f"{admission.at_seconds:.3f} s; resident models' last marks then: {marks})"
            + "".join(_asked(record, m, admission.at_seconds) for m in asked)
        )
    n = len(replayed.admitted)
    if len(real) > n:
        return f"swap-in {n + 1}: {_said(real[n])}; no replayed one"
    return None


def _asked(record: RunRecord, model: str, at_seconds: float) -> str:
    """When `model` was asked for by the request that waited for it at `at_seconds`: sent,
    received by the gateway, and where its wait's end and the swap-ins' own timing
    disagree."""
    ends = swap_in_ends(record)
    waiting = [
        r
        for r in record.requests
        if r.model == model
        and r.queue_wait_seconds > 0
        and r.arrival_at_gateway_seconds + r.queue_wait_seconds >= at_seconds
    ]
    if not waiting:
        return ""
    first = min(waiting, key=lambda r: r.arrival_at_gateway_seconds)
    received = (
        "" if first.received_seconds is None else f", received at {first.received_seconds:.3f} s"
    )
    text = f"; {model} asked for at {first.arrival_seconds:.3f} s{received}"
    swap = next(
        (s for s in record.swaps
         if s.kind == "in" and s.model == model
         and s.seen_at_seconds > first.arrival_at_gateway_seconds),
        None,
    )  # fmt: skip
    end = ends[(model, swap.number)].ended_at_seconds if swap is not None else None
    waited_until = first.arrival_at_gateway_seconds + first.queue_wait_seconds
    if end is not None and end > waited_until + 0.001:
        text += (
            f" (its wait ended at {waited_until:.3f} s, but the swap-ins before it put its "
            f"end no earlier than {end:.3f} s, {(end - waited_until) * 1e3:.0f} ms later)"
        )
    return text


def _said(real: _RealIn) -> str:
    return (
        f"real {real.model} (seen at {real.seen_at_seconds:.3f} s; seen going out since the "
        f"swap-in before: {', '.join(real.outs) or 'nothing'})"
    )
