"""The discrete-event loop: one run of one policy on a fixed number of GPUs over a trace.

What it models, per GPU:
- residency: each model is resident, swapping in, swapping out or out; what the policy
  charges to HBM is never more than the GPU's budget (the policy's admission decides);
- compute: `concurrent_requests` slots shared by the GPU's models; a request holds one
  for its service time (its model's per-token time x its tokens), FIFO by arrival among
  requests whose model is resident;
- swaps: a request for a model that is out asks the policy (once per model, however many
  requests wait); an admission's victims drain (their running requests finish; queued ones
  wait for the model's return) and swap out, then the swap-in starts; copies queue FIFO on
  the GPU's host→device link, device→host link, or cold-storage path, each taking
  bytes / bandwidth after a fixed cost that overlaps other copies;
- the policy's idle and pressure swap-outs, asked whenever a model may have become due
  (as an agent policy loop that never sleeps) and after every swap-in.

A request's wait = the moment it gets a slot - its arrival: waiting for its model to come
in and for a slot (its own service time is not a wait). Its added latency (report.py) is
its wait minus its wait in the dedicated run of the same trace.

What it leaves out: replicas (a model lives on one GPU, as in the product), batching's
effect on per-token time, prefill unless the catalogue gives a per-input-token time, KV
cache growth and offload, the gateway's `maxQueued`/`queueTimeout` refusals, the agent's
30 s admission deadline, network time, failures.

The loop keeps per-request data in the trace's lists and per-model/GPU state in slotted
objects; events are tuples on one heap; arrivals are read from the sorted trace rather
than pushed.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from modelswap_api.policy import EffectivePolicy
from modelswap_sidecar.policy.inputs import Residency
from modelswap_sidecar.simulate.catalogue import CatalogueModel
from modelswap_sidecar.simulate.policies import SimPolicy, Transfer
from modelswap_sidecar.simulate.state import INFINITY, GpuState, ModelState
from modelswap_sidecar.simulate.traces import Trace

_COMPLETE, _SWAPPED_IN, _SWAPPED_OUT, _CHECK = 0, 1, 2, 3
#: a policy check due "now" runs this much later, so a deadline that floating point puts a
#: hair early is not asked again at the same instant
_CHECK_NUDGE_SECONDS = 1e-6


@dataclass(frozen=True, kw_only=True)
class RunResult:
    policy: str
    gpus: int
    requests: int
    #: the requests that waited at all (indices into the trace) and their waits (seconds)
    waited_requests: list[int]
    waits_seconds: list[float]
    #: requests never served: refused by the policy, or still waiting when events ran out
    unserved_requests: list[int]
    swap_ins: int
    cold_loads: int
    swap_outs: int
    admissions: int
    duration_seconds: float
    busy_slot_seconds: float
    slots_per_gpu: int
    wall_seconds: float
    #: every warm swap-in's duration as the agent's engine times one: from its admission
    #: (the victims' drain and swap-out are inside it, as `make_room` is inside the
    #: engine's swap-in) until its bytes are in (fixed cost, then the copy queued behind
    #: other copies on its link); the twin check compares them with the agent's
    swap_in_seconds: list[float] = field(default_factory=list)


def run(
    trace: Trace,
    catalogue: Sequence[CatalogueModel],
    effective: Sequence[EffectivePolicy],
    policy: SimPolicy,
    *,
    assignment: Sequence[int],
    gpus: int,
    warm_order: Sequence[int],
) -> RunResult:
    """Simulate `trace` under `policy` with model i on GPU `assignment[i]`.

    Before the trace starts, each GPU loads its models in `warm_order` while they fit (a
    deployment that has settled); the rest start out (warm in the host store, or cold for
    policies that keep no host copy).
    """
    started = time.perf_counter()
    loop = _Loop(trace, catalogue, effective, policy, assignment=assignment, gpus=gpus)
    loop.warm(warm_order)
    loop.run()
    return loop.result(time.perf_counter() - started)


class _Loop:
    def __init__(
        self,
        trace: Trace,
        catalogue: Sequence[CatalogueModel],
        effective: Sequence[EffectivePolicy],
        policy: SimPolicy,
        *,
        assignment: Sequence[int],
        gpus: int,
    ) -> None:
        self.trace = trace
        self.policy = policy
        hosted = [0] * gpus
        for g in assignment:
            hosted[g] += 1
        slots = policy.shape.concurrent_requests
        self.gpus = [GpuState(g, slots, policy.budget_bytes(hosted[g])) for g in range(gpus)]
        self.models: list[ModelState] = []
        for i, (model, g) in enumerate(zip(catalogue, assignment, strict=True)):
            state = ModelState(
                index=i,
                name=model.name,
                weights_bytes=model.weights_bytes,
                kv_cache_bytes=model.kv_cache_bytes,
                policy=effective[i],
                gpu=self.gpus[g],
            )
            state.cold = not policy.keeps_host_copy
            self.gpus[g].models.append(state)
            self.models.append(state)
        per_out = [m.per_output_token_seconds for m in catalogue]
        per_in = [m.per_input_token_seconds for m in catalogue]
        self.service = [
            o * per_out[m] + i * per_in[m]
            for m, i, o in zip(
                trace.model_index, trace.input_tokens, trace.output_tokens, strict=True
            )
        ]
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = itertools.count()
        self.waited: list[int] = []
        self.waits: list[float] = []
        self.unserved: list[int] = []
        self.admissions = 0
        self.swap_in_seconds: list[float] = []
        self.last_arrival = trace.arrival_seconds[-1] if len(trace) else 0.0
        self.has_idle = type(policy).idle_deadline is not SimPolicy.idle_deadline

    # -- setup and results ------------------------------------------------------------------

    def warm(self, order: Sequence[int]) -> None:
        overhead = self.policy.loaded_overhead_bytes()
        used = [0] * len(self.gpus)
        for i in order:
            m = self.models[i]
            g = m.gpu
            if self.policy.dedicated or used[g.index] + m.hbm_bytes + overhead <= g.budget_bytes:
                used[g.index] += m.hbm_bytes + overhead
                m.residency = Residency.RESIDENT
                m.resident_since = 0.0
                m.cold = False
        for g in self.gpus:
            self._schedule_check(g, 0.0)

    def result(self, wall_seconds: float) -> RunResult:
        left = [k for m in self.models for k in m.pending]
        return RunResult(
            policy=self.policy.name,
            gpus=len(self.gpus),
            requests=len(self.trace),
            waited_requests=self.waited,
            waits_seconds=self.waits,
            unserved_requests=sorted(self.unserved + left),
            swap_ins=sum(m.swap_ins for m in self.models),
            cold_loads=sum(m.cold_loads for m in self.models),
            swap_outs=sum(m.swap_outs for m in self.models),
            admissions=self.admissions,
            duration_seconds=self.trace.duration_seconds,
            busy_slot_seconds=sum(self.service),
            slots_per_gpu=self.policy.shape.concurrent_requests,
            wall_seconds=wall_seconds,
            swap_in_seconds=self.swap_in_seconds,
        )

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        heap = self.heap
        heappush, heappop = heapq.heappush, heapq.heappop
        seq = self.seq
        arrivals = self.trace.arrival_seconds
        owner = self.trace.model_index
        service = self.service
        models = self.models
        waits = self.waits
        waited = self.waited
        resident = Residency.RESIDENT
        swapped_out = Residency.SWAPPED_OUT
        policy = self.policy
        has_idle = self.has_idle
        n = len(arrivals)
        i = 0
        while True:
            if heap and (i >= n or heap[0][0] <= arrivals[i]):
                t, _, kind, obj = heappop(heap)
                if kind == _COMPLETE:
                    j = obj
                    assert isinstance(j, int)
                    m = models[owner[j]]
                    g = m.gpu
                    m.running -= 1
                    m.last_request = t
                    g.slots_free += 1
                    ready = g.ready
                    while ready and g.slots_free:
                        k = heappop(ready)
                        mk = models[owner[k]]
                        mk.queued -= 1
                        mk.running += 1
                        g.slots_free -= 1
                        waited.append(k)
                        waits.append(t - arrivals[k])
                        heappush(heap, (t + service[k], next(seq), _COMPLETE, k))
                    if m.draining:
                        if not m.running:
                            m.draining = False
                            self._start_out(m, t)
                    elif has_idle and not m.running and not m.queued:
                        deadline = policy.idle_deadline(g, m, t)
                        if deadline < g.check_at:
                            self._schedule_at(g, deadline, t)
                    if g.waiting:
                        self._retry(g, t)
                elif kind == _SWAPPED_IN:
                    assert isinstance(obj, ModelState)
                    self._swapped_in(obj, t)
                elif kind == _SWAPPED_OUT:
                    assert isinstance(obj, ModelState)
                    self._swapped_out(obj, t)
                else:
                    assert isinstance(obj, GpuState)
                    if t == obj.check_at:
                        obj.check_at = INFINITY
                        self._apply_swap_outs(obj, t)
                        self._schedule_check(obj, t)
                        if obj.waiting:
                            self._retry(obj, t)
            elif i < n:
                t = arrivals[i]
                m = models[owner[i]]
                m.last_request = t
                residency = m.residency
                if residency is resident:
                    g = m.gpu
                    if g.slots_free:
                        g.slots_free -= 1
                        m.running += 1
                        heappush(heap, (t + service[i], next(seq), _COMPLETE, i))
                    else:
                        heappush(g.ready, i)
                        m.queued += 1
                else:
                    m.pending.append(i)
                    # a model swapping out is asked for again when its swap-out ends
                    if residency is swapped_out and not m.waiting:
                        self._request(m, t)
                i += 1
            else:
                break

    # -- swaps ------------------------------------------------------------------------------

    def _request(self, m: ModelState, t: float) -> None:
        """Ask the policy to bring `m` in (it is out and has pending requests); with serial
        admissions, after the swap-in under way on its GPU (if any) is done."""
        g = m.gpu
        if self.policy.serial_admissions and g.admitting is not None:
            if g.admitting is not m and not m.admission_queued:
                m.admission_queued = True
                g.admission_queue.append(m)
            return
        self.admissions += 1
        if m.asked_at is None:
            m.asked_at = t
        decision = self.policy.admit(g, m, t)
        if decision.outcome == "admit":
            m.residency = Residency.SWAPPING_IN
            m.admitted_at = t
            if self.policy.serial_admissions:
                g.admitting = m
            for v in decision.victims:
                if v.residency is Residency.RESIDENT:
                    self._begin_out(v, t)
                v.dependents.append(m)
                m.awaiting_victims += 1
            if not m.awaiting_victims:
                self._start_in(m, t)
        elif decision.outcome == "wait":
            m.waiting = True
            g.waiting.append(m)
            if decision.ask_again_at < g.check_at:  # requests are waiting: even after the
                self._schedule_at(g, decision.ask_again_at, t, always=True)  # last arrival
        else:
            self.unserved.extend(m.pending)
            m.pending = []
            m.asked_at = None

    def _retry(self, g: GpuState, t: float) -> None:
        waiting, g.waiting = g.waiting, []
        for m in waiting:
            m.waiting = False
            if m.residency is Residency.SWAPPED_OUT and m.pending and not m.waiting:
                self._request(m, t)

    def _begin_out(self, v: ModelState, t: float) -> None:
        v.residency = Residency.SWAPPING_OUT
        g = v.gpu
        if v.queued:
            owner = self.trace.model_index
            keep = [k for k in g.ready if owner[k] != v.index]
            v.pending.extend(sorted(k for k in g.ready if owner[k] == v.index))
            heapq.heapify(keep)
            g.ready = keep
            v.queued = 0
        if v.running:
            v.draining = True
        else:
            self._start_out(v, t)

    def _start_out(self, v: ModelState, t: float) -> None:
        done = self._transfer(v.gpu, self.policy.swap_out(v), t)
        heapq.heappush(self.heap, (done, next(self.seq), _SWAPPED_OUT, v))

    def _start_in(self, m: ModelState, t: float) -> None:
        transfer = self.policy.swap_in(m)
        done = self._transfer(m.gpu, transfer, t)
        if transfer.link == "cold":
            m.cold_loads += 1
        else:
            m.swap_ins += 1
            self.swap_in_seconds.append(done - m.admitted_at)
        heapq.heappush(self.heap, (done, next(self.seq), _SWAPPED_IN, m))

    @staticmethod
    def _transfer(g: GpuState, transfer: Transfer, t: float) -> float:
        """When a copy started at `t` ends: fixed cost, then FIFO on its link."""
        ready_at = t + transfer.fixed_seconds
        if transfer.link == "none" or transfer.bytes == 0:
            return ready_at
        seconds = transfer.bytes / transfer.bytes_per_second
        if transfer.link == "h2d":
            g.h2d_free_at = done = max(ready_at, g.h2d_free_at) + seconds
        elif transfer.link == "d2h":
            g.d2h_free_at = done = max(ready_at, g.d2h_free_at) + seconds
        else:
            g.cold_free_at = done = max(ready_at, g.cold_free_at) + seconds
        return done

    def _next_admission(self, g: GpuState, t: float) -> None:
        """The GPU's admission step is free: ask for the queued models in order until one
        is admitted (and holds it again) or none is left."""
        queue = g.admission_queue
        while queue and g.admitting is None:
            m = queue.popleft()
            m.admission_queued = False
            if m.residency is Residency.SWAPPED_OUT and m.pending and not m.waiting:
                self._request(m, t)

    def _swapped_in(self, m: ModelState, t: float) -> None:
        g = m.gpu
        m.residency = Residency.RESIDENT
        m.resident_since = t
        m.asked_at = None
        m.cold = False
        if g.admitting is m:
            g.admitting = None
        if m.pending:
            ready = g.ready
            for k in m.pending:
                heapq.heappush(ready, k)
            m.queued += len(m.pending)
            m.pending = []
            self._dispatch(g, t)
        self._apply_swap_outs(g, t)
        self._schedule_check(g, t)
        if g.waiting:
            self._retry(g, t)
        self._next_admission(g, t)

    def _swapped_out(self, v: ModelState, t: float) -> None:
        g = v.gpu
        v.residency = Residency.SWAPPED_OUT
        v.resident_since = None
        v.swap_outs += 1
        v.cold = self.policy.leaves_cold(v)
        for d in v.dependents:
            d.awaiting_victims -= 1
            if not d.awaiting_victims:
                self._start_in(d, t)
        v.dependents = []
        if v.pending and not v.waiting:
            v.waiting = True
            g.waiting.append(v)
        if g.waiting:
            self._retry(g, t)

    def _dispatch(self, g: GpuState, t: float) -> None:
        ready, models, owner = g.ready, self.models, self.trace.model_index
        arrivals, service = self.trace.arrival_seconds, self.service
        while ready and g.slots_free:
            k = heapq.heappop(ready)
            mk = models[owner[k]]
            mk.queued -= 1
            mk.running += 1
            g.slots_free -= 1
            self.waited.append(k)
            self.waits.append(t - arrivals[k])
            heapq.heappush(self.heap, (t + service[k], next(self.seq), _COMPLETE, k))

    # -- policy checks ----------------------------------------------------------------------

    def _apply_swap_outs(self, g: GpuState, t: float) -> None:
        for v in self.policy.swap_outs(g, t):
            if v.residency is Residency.RESIDENT:
                self._begin_out(v, t)

    def _schedule_check(self, g: GpuState, t: float) -> None:
        if not self.has_idle:
            return
        deadline = min((self.policy.idle_deadline(g, m, t) for m in g.models), default=INFINITY)
        if deadline < g.check_at:
            self._schedule_at(g, deadline, t)

    def _schedule_at(self, g: GpuState, deadline: float, t: float, *, always: bool = False) -> None:
        if deadline > self.last_arrival and not always:
            return  # an idle swap-out after the last arrival changes no added latency
        deadline = max(deadline, t + _CHECK_NUDGE_SECONDS)
        g.check_at = deadline
        heapq.heappush(self.heap, (deadline, next(self.seq), _CHECK, g))
