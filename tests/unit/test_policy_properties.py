"""Property tests of the node policy (hypothesis, derandomized: the same cases every run).

Never a pinned victim; never past the HBM budget; never a model younger than minResident
unless the request would otherwise be refused; same inputs → same decisions.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelswap_api.models import KvMode, OnSwapOut
from modelswap_api.policy import EffectivePolicy
from modelswap_api.quantities import Duration
from modelswap_sidecar.policy.admission import admit
from modelswap_sidecar.policy.decisions import AdmissionOutcome, SwapOut, SwapOutReason
from modelswap_sidecar.policy.inputs import (
    GpuView,
    ModelView,
    NodeView,
    PolicySettings,
    Residency,
)
from modelswap_sidecar.policy.swapouts import plan_swap_outs
from modelswap_sidecar.policy.victims import evictable

MiB = 1 << 20
NOW = 50_000.0
GPUS = ("gpu0", "gpu1")
CASES = settings(
    max_examples=2500,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def policies(draw: st.DrawFn) -> EffectivePolicy:
    never = draw(st.integers(0, 5)) == 0
    idle_after = draw(st.integers(0, 3600))
    min_resident = draw(st.integers(0, 3600 if never else idle_after))
    pinned = draw(st.integers(0, 5)) == 0
    on_swap_out: OnSwapOut = "host" if pinned else draw(st.sampled_from(["host", "drop"]))
    kv: KvMode = "discard"
    if on_swap_out == "host":
        kv = draw(st.sampled_from(["discard", "preserve"]))
    return EffectivePolicy(
        idle_after=Duration("never" if never else f"{idle_after}s"),
        min_resident=Duration(f"{min_resident}s"),
        priority=draw(st.integers(0, 3)),
        pinned=pinned,
        on_swap_out=on_swap_out,
        kv=kv,
        offload_after_tokens=4096,
        kv_host_bytes=MiB,
        max_queued=10,
        queue_timeout=Duration("60s"),
    )


@st.composite
def model_views(draw: st.DrawFn, uid: str) -> ModelView:
    residency = draw(
        st.sampled_from(list(Residency))
        if draw(st.integers(0, 3)) == 0
        else st.sampled_from([Residency.RESIDENT, Residency.SWAPPED_OUT])
    )
    since = NOW - draw(st.integers(0, 7200))
    has_since = residency in (Residency.RESIDENT, Residency.SWAPPING_OUT)
    return ModelView(
        uid=uid,
        gpu=draw(st.sampled_from(GPUS)),
        weights_bytes=draw(st.integers(1, 64)) * 64 * MiB,
        kv_cache_bytes=draw(st.sampled_from([0, 0, 128 * MiB, 512 * MiB])),
        residency=residency,
        policy=draw(policies()),
        resident_since_seconds=since if has_since else None,
        last_request_seconds=draw(st.none() | st.floats(NOW - 7200, NOW)),
        active_requests=draw(st.sampled_from([0, 0, 0, 1, 3])),
    )


@st.composite
def nodes(draw: st.DrawFn) -> NodeView:
    """1 to 10 models on two GPUs, never more charged on a GPU than its budget."""
    gpus = tuple(
        GpuView(
            gpu=gpu,
            budget_bytes=draw(st.integers(16, 96)) * 64 * MiB,
            host_to_device_bytes_per_second=draw(st.sampled_from([25e9, 55e9, 350e9])),
        )
        for gpu in GPUS
    )
    count = draw(st.integers(1, 10))
    models = [draw(model_views(f"m{i:02d}")) for i in range(count)]
    budget = {g.gpu: g.budget_bytes for g in gpus}
    fitted: list[ModelView] = []
    for m in models:
        used = sum(f.hbm_bytes for f in fitted if f.gpu == m.gpu and f.charged)
        fits = not m.charged or used + m.hbm_bytes <= budget[m.gpu]
        fitted.append(m if fits else dataclasses.replace(m, residency=Residency.SWAPPED_OUT))
    return NodeView(gpus=gpus, models=tuple(fitted))


def settings_of(draw_high: int, draw_low: int) -> PolicySettings:
    low, high = sorted((draw_low / 100, draw_high / 100))
    return PolicySettings(high_watermark_fraction=high, low_watermark_fraction=low)


watermarks = st.builds(settings_of, st.integers(50, 100), st.integers(50, 100))
times = st.floats(NOW, NOW + 4000)


def after(node: NodeView, victims: tuple[SwapOut, ...]) -> dict[str, int]:
    gone = {v.uid for v in victims}
    return {
        g.gpu: sum(m.hbm_bytes for m in node.models_on(g.gpu) if m.charged and m.uid not in gone)
        for g in node.gpus
    }


@CASES
@given(node=nodes(), now=times, policy_settings=watermarks, rng=st.randoms(use_true_random=False))
def test_decisions_on_any_node_are_safe_and_deterministic(
    node: NodeView, now: float, policy_settings: PolicySettings, rng: random.Random
) -> None:
    shuffled = _shuffled(node, rng)
    check_plan(node, shuffled, now, policy_settings)
    for model in node.models:
        check_admission(node, shuffled, model.uid, now, policy_settings)


def check_admission(
    node: NodeView, shuffled: NodeView, uid: str, now: float, policy_settings: PolicySettings
) -> None:
    requested = node.model(uid)
    gpu = node.gpu(requested.gpu)
    answer = admit(node, uid, now, policy_settings)

    victims = {v.uid: node.model(v.uid) for v in answer.victims}
    assert len(victims) == len(answer.victims)
    for victim in victims.values():
        assert not victim.policy.pinned, "a pinned model was chosen as a victim"
        assert victim.residency is Residency.RESIDENT
        assert victim.gpu == requested.gpu and victim.uid != uid
    if answer.outcome is not AdmissionOutcome.ADMIT:
        assert answer.victims == ()

    if answer.outcome is AdmissionOutcome.ADMIT and requested.residency is Residency.SWAPPED_OUT:
        used = after(node, answer.victims)[gpu.gpu] + requested.hbm_bytes
        assert used <= gpu.budget_bytes, "admission would exceed the HBM budget"
        deficit = node.used_bytes(gpu.gpu) + requested.hbm_bytes - gpu.budget_bytes
        for victim in victims.values():  # no victim is there for nothing
            assert answer.bytes_freed - victim.hbm_bytes < deficit

    if any(not evictable(v, now, allow_young=False) for v in victims.values()):
        # Young (or busy) victims only when ordinary victims plus the swap-outs under way
        # could not make room, i.e. the request would otherwise have been refused.
        assert answer.reason == "VictimsChosenUnderMinResident"
        ordinary = sum(
            m.hbm_bytes
            for m in node.models_on(gpu.gpu)
            if m.uid != uid and evictable(m, now, allow_young=False)
        )
        deficit = node.used_bytes(gpu.gpu) + requested.hbm_bytes - gpu.budget_bytes
        assert ordinary + node.leaving_bytes(gpu.gpu) < deficit

    if answer.outcome is AdmissionOutcome.REFUSE and answer.reason == "NoRoom":
        evictable_bytes = sum(
            m.hbm_bytes
            for m in node.models_on(gpu.gpu)
            if m.uid != uid and (m.residency is not Residency.SWAPPED_OUT) and not m.policy.pinned
        )
        free = gpu.budget_bytes - node.used_bytes(gpu.gpu)
        assert free + evictable_bytes < requested.hbm_bytes, "refused although room was possible"

    assert admit(node, uid, now, policy_settings) == answer
    assert admit(shuffled, uid, now, policy_settings) == answer  # order of inputs is no input

    # A caller that can still wait never gets a busy victim: it waits for one to go idle.
    waiting = admit(node, uid, now, policy_settings, waited_seconds=0.0)
    assert all(node.model(v.uid).active_requests == 0 for v in waiting.victims)
    if waiting != answer:
        assert (waiting.outcome, waiting.reason) == (AdmissionOutcome.WAIT, "WaitingForIdle")
        # without time to wait: a busy victim, or a wait for bytes already under way
        busy_victims = any(node.model(v.uid).active_requests for v in answer.victims)
        assert busy_victims or answer.outcome is AdmissionOutcome.WAIT


def check_plan(
    node: NodeView, shuffled: NodeView, now: float, policy_settings: PolicySettings
) -> None:
    outs = plan_swap_outs(node, now, policy_settings)
    uids = [o.uid for o in outs]
    assert len(set(uids)) == len(uids)
    for out in outs:
        model = node.model(out.uid)
        assert not model.policy.pinned, "a pinned model was planned for swap-out"
        assert model.residency is Residency.RESIDENT and model.active_requests == 0
        assert not model.is_young(now), "a model younger than minResident was swapped out"
        if out.reason is SwapOutReason.IDLE:
            idle_after = model.policy.idle_after.seconds
            assert idle_after is not None and model.idle_seconds(now) >= idle_after
    for gpu in node.gpus:  # pressure reaches the low watermark (or takes all it may), no more
        pressure = [o for o in outs if o.gpu == gpu.gpu and o.reason is SwapOutReason.PRESSURE]
        if not pressure:
            continue
        remaining = after(node, outs)[gpu.gpu] - node.leaving_bytes(gpu.gpu)
        low = gpu.budget_bytes * policy_settings.low_watermark_fraction
        spare = [
            m
            for m in node.models_on(gpu.gpu)
            if m.uid not in uids and evictable(m, now, allow_young=False)
        ]
        assert remaining <= low or not spare
        if remaining <= low:
            for out in pressure:
                assert remaining + out.bytes_freed > low, f"{out.uid} was not needed"
    assert plan_swap_outs(node, now, policy_settings) == outs
    assert plan_swap_outs(shuffled, now, policy_settings) == outs


# --- a trace: requests and time passing, decisions applied at once --------------------------

events = st.lists(
    st.tuples(st.sampled_from(["tick", "request"]), st.integers(0, 9), st.integers(1, 900)),
    min_size=1,
    max_size=40,
)


@settings(CASES, max_examples=500)
@given(node=nodes(), trace=events, policy_settings=watermarks)
def test_a_trace_never_exceeds_the_budget_or_evicts_pinned_models(
    node: NodeView, trace: list[tuple[str, int, int]], policy_settings: PolicySettings
) -> None:
    # Settle the in-between residencies: the trace applies every decision instantly.
    now = NOW
    node = _settled(node, now)
    pinned_resident = {m.uid for m in node.models if m.policy.pinned and m.charged}
    for kind, index, seconds in trace:
        if kind == "tick":
            now += seconds
            outs = plan_swap_outs(node, now, policy_settings)
            node = _apply(node, outs)
        else:
            uid = node.models[index % len(node.models)].uid
            answer = admit(node, uid, now, policy_settings)
            assert answer.outcome is not AdmissionOutcome.WAIT  # nothing is ever under way
            if answer.outcome is AdmissionOutcome.ADMIT:
                node = _apply(node, answer.victims)
                node = _replace(node, uid, functools.partial(_swapped_in, now=now))
        for gpu in node.gpus:
            assert node.used_bytes(gpu.gpu) <= gpu.budget_bytes
        resident = {m.uid for m in node.models if m.charged}
        assert pinned_resident <= resident, "a pinned model left HBM"


def _settled(node: NodeView, now: float) -> NodeView:
    def settle(m: ModelView) -> ModelView:
        m = dataclasses.replace(m, active_requests=0)
        if m.residency in (Residency.LOADING, Residency.SWAPPING_IN):
            return dataclasses.replace(m, residency=Residency.RESIDENT, resident_since_seconds=now)
        if m.residency is Residency.SWAPPING_OUT:
            return dataclasses.replace(
                m, residency=Residency.SWAPPED_OUT, resident_since_seconds=None
            )
        return m

    return dataclasses.replace(node, models=tuple(settle(m) for m in node.models))


def _swapped_in(m: ModelView, now: float) -> ModelView:
    """After an admitted request: resident (since now, unless it already was), just used."""
    since = m.resident_since_seconds if m.residency is Residency.RESIDENT else now
    return dataclasses.replace(
        m, residency=Residency.RESIDENT, resident_since_seconds=since, last_request_seconds=now
    )


def _apply(node: NodeView, outs: tuple[SwapOut, ...]) -> NodeView:
    for out in outs:
        node = _replace(
            node,
            out.uid,
            lambda m: dataclasses.replace(
                m, residency=Residency.SWAPPED_OUT, resident_since_seconds=None
            ),
        )
    return node


def _replace(node: NodeView, uid: str, change: Callable[[ModelView], ModelView]) -> NodeView:
    return dataclasses.replace(
        node, models=tuple(change(m) if m.uid == uid else m for m in node.models)
    )


def _shuffled(node: NodeView, rng: random.Random) -> NodeView:
    models = list(node.models)
    gpus = list(node.gpus)
    rng.shuffle(models)
    rng.shuffle(gpus)
    return NodeView(gpus=tuple(gpus), models=tuple(models))
