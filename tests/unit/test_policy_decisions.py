"""Focused cases of the node policy: idle swap-out, victims, minResident, watermarks, KV."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from modelswap_api.policy import EffectivePolicy
from modelswap_api.quantities import Duration
from modelswap_sidecar.policy.admission import admit
from modelswap_sidecar.policy.decisions import AdmissionOutcome, SwapOutReason
from modelswap_sidecar.policy.errors import PolicyInputError
from modelswap_sidecar.policy.facade import Policy
from modelswap_sidecar.policy.inputs import GpuView, ModelView, NodeView, PolicySettings, Residency
from modelswap_sidecar.policy.kv import host_bytes_needed, kv_pool_settings
from modelswap_sidecar.policy.scoring import restore_seconds
from modelswap_sidecar.policy.swapouts import plan_swap_outs

GiB = 1 << 30
NOW = 100_000.0
SETTINGS = PolicySettings()
GPU = GpuView(gpu="gpu0", budget_bytes=10 * GiB, host_to_device_bytes_per_second=50e9)


def policy(**changes: Any) -> EffectivePolicy:
    base = EffectivePolicy(
        idle_after=Duration("10m"),
        min_resident=Duration("1m"),
        priority=100,
        pinned=False,
        on_swap_out="host",
        kv="discard",
        offload_after_tokens=4096,
        kv_host_bytes=GiB,
        max_queued=100,
        queue_timeout=Duration("60s"),
    )
    return replace(base, **changes)


def model(
    uid: str,
    size_gib: float = 1,
    *,
    residency: Residency = Residency.RESIDENT,
    since_ago: float = 3600,
    request_ago: float | None = None,
    **policy_changes: Any,
) -> ModelView:
    charged_since = residency in (Residency.RESIDENT, Residency.SWAPPING_OUT)
    return ModelView(
        uid=uid,
        gpu="gpu0",
        weights_bytes=int(size_gib * GiB),
        residency=residency,
        policy=policy(**policy_changes),
        resident_since_seconds=NOW - since_ago if charged_since else None,
        last_request_seconds=None if request_ago is None else NOW - request_ago,
    )


def node(*models: ModelView, gpu: GpuView = GPU) -> NodeView:
    return NodeView(gpus=(gpu,), models=models)


def wanted(uid: str, size_gib: float = 1, **changes: Any) -> ModelView:
    return model(uid, size_gib, residency=Residency.SWAPPED_OUT, **changes)


# --- idle swap-out ---------------------------------------------------------------------


def test_a_model_idle_past_idle_after_is_swapped_out_and_one_just_short_of_it_is_not() -> None:
    stale = model("stale", request_ago=601)
    fresh = model("fresh", request_ago=599)
    (out,) = plan_swap_outs(node(stale, fresh), NOW, SETTINGS)
    assert (out.uid, out.reason, out.bytes_freed) == ("stale", SwapOutReason.IDLE, GiB)
    assert "idleAfter 10m" in out.message


def test_idle_time_counts_from_the_swap_in_when_no_request_came_since() -> None:
    # Swapped in manually 5 minutes ago, last request an hour ago: not idle for 10m yet.
    assert plan_swap_outs(node(model("m", since_ago=300, request_ago=3600)), NOW, SETTINGS) == ()


def test_never_pinned_busy_or_mid_swap_models_are_not_idle() -> None:
    models = (
        model("never", request_ago=10**6, idle_after=Duration("never")),
        model("pinned", request_ago=10**6, pinned=True),
        replace(model("busy", request_ago=10**6), active_requests=1),
        model("leaving", request_ago=10**6, residency=Residency.SWAPPING_OUT),
    )
    assert plan_swap_outs(node(*models), NOW, SETTINGS) == ()


def test_a_drop_model_is_marked_for_drop() -> None:
    (out,) = plan_swap_outs(node(model("d", request_ago=700, on_swap_out="drop")), NOW, SETTINGS)
    assert out.drop


# --- watermarks --------------------------------------------------------------------------


def test_above_the_high_watermark_victims_go_until_use_is_below_the_low_watermark() -> None:
    # 10 GiB budget, high 0.95, low 0.85: 9.75 GiB in use → free at least 1.25 GiB.
    models = [model(f"m{i}", 0.75, request_ago=100 + i) for i in range(13)]
    outs = plan_swap_outs(node(*models), NOW, SETTINGS)
    assert {o.reason for o in outs} == {SwapOutReason.PRESSURE}
    assert [o.uid for o in outs] == ["m12", "m11"]  # the longest idle first
    assert 9.75 * GiB - sum(o.bytes_freed for o in outs) <= 8.5 * GiB


def test_at_or_below_the_high_watermark_nothing_is_swapped_out_for_pressure() -> None:
    models = [model(f"m{i}", 0.5, request_ago=100) for i in range(19)]  # 9.5 GiB = high
    assert plan_swap_outs(node(*models), NOW, SETTINGS) == ()


def test_pressure_counts_swaps_already_under_way_and_spares_young_models() -> None:
    models = [
        model("leaving", 1, residency=Residency.SWAPPING_OUT, request_ago=100),
        model("young", 8.8, since_ago=10),
    ]
    # 9.8 GiB charged, but 1 GiB is leaving: 8.8 GiB is below the high watermark.
    assert plan_swap_outs(node(*models), NOW, SETTINGS) == ()
    crowded = node(model("young", 9.8, since_ago=10))
    assert plan_swap_outs(crowded, NOW, SETTINGS) == ()  # above high, but young


# --- admission -----------------------------------------------------------------------------


def test_a_model_that_fits_is_admitted_without_victims() -> None:
    answer = admit(node(model("a", 4), wanted("b", 6)), "b", NOW, SETTINGS)
    assert (answer.outcome, answer.reason, answer.victims) == (AdmissionOutcome.ADMIT, "Fits", ())


def test_lowest_priority_goes_first_whatever_the_score() -> None:
    models = (
        model("important-idle", 5, priority=10, request_ago=3000),
        model("cheap-busy", 5, priority=1, request_ago=1),
        wanted("new", 5),
    )
    answer = admit(node(*models), "new", NOW, SETTINGS)
    assert answer.outcome is AdmissionOutcome.ADMIT
    assert [v.uid for v in answer.victims] == ["cheap-busy"]
    assert answer.victims[0].reason is SwapOutReason.MAKE_ROOM


def test_within_a_priority_the_best_bytes_times_idle_over_cost_goes_first() -> None:
    models = (
        model("recent", 4, request_ago=120),
        model("long-idle", 4, request_ago=500),
        # Idle longest, but a drop model costs a reload from the source to bring back.
        model("drop", 4, request_ago=590, on_swap_out="drop"),
        wanted("new", 4),
    )
    answer = admit(node(*models, gpu=replace(GPU, budget_bytes=12 * GiB)), "new", NOW, SETTINGS)
    assert [v.uid for v in answer.victims] == ["long-idle"]


def test_a_victim_that_turns_out_unneeded_is_given_back() -> None:
    models = (
        model("small", 1, priority=1, request_ago=100),
        model("big", 6, priority=2, request_ago=100),
        model("other", 3, priority=3, request_ago=100),
        wanted("new", 6),
    )
    answer = admit(node(*models), "new", NOW, SETTINGS)
    assert [v.uid for v in answer.victims] == ["big"]  # 'small' alone could never do


def test_pinned_models_are_never_victims_and_the_refusal_says_why() -> None:
    answer = admit(node(model("pinned", 8, pinned=True), wanted("new", 4)), "new", NOW, SETTINGS)
    assert (answer.outcome, answer.reason) == (AdmissionOutcome.REFUSE, "NoRoom")
    assert "8589934592 of them pinned" in answer.message


def test_a_model_bigger_than_the_whole_budget_is_refused_at_once() -> None:
    answer = admit(node(wanted("huge", 11)), "huge", NOW, SETTINGS)
    assert (answer.outcome, answer.reason) == (AdmissionOutcome.REFUSE, "LargerThanBudget")


def test_young_models_are_spared_while_older_ones_can_make_room() -> None:
    models = (
        model("young", 5, priority=1, since_ago=30, request_ago=30),
        model("old", 5, priority=5, since_ago=120, request_ago=120),
        wanted("new", 5),
    )
    answer = admit(node(*models), "new", NOW, SETTINGS)
    assert [v.uid for v in answer.victims] == ["old"]
    assert answer.reason == "VictimsChosen"


def test_young_models_go_only_when_the_request_would_otherwise_be_refused() -> None:
    models = (model("young", 8, since_ago=30, request_ago=30), wanted("new", 5))
    answer = admit(node(*models), "new", NOW, SETTINGS)
    assert answer.outcome is AdmissionOutcome.ADMIT
    assert answer.reason == "VictimsChosenUnderMinResident"
    assert [v.uid for v in answer.victims] == ["young"]


def busy(uid: str, size_gib: float, active: int, **changes: Any) -> ModelView:
    return replace(model(uid, size_gib, request_ago=0, **changes), active_requests=active)


def test_a_busy_model_is_waited_for_while_the_caller_has_time_to_wait() -> None:
    models = (busy("serving", 8, active=2), wanted("new", 5))
    answer = admit(node(*models), "new", NOW, SETTINGS, waited_seconds=0.0)
    assert (answer.outcome, answer.reason, answer.victims) == (
        AdmissionOutcome.WAIT,
        "WaitingForIdle",
        (),
    )
    assert "10s" in answer.message


def test_a_busy_model_drains_once_the_wait_is_over_or_the_caller_cannot_wait() -> None:
    models = (busy("serving", 8, active=2), wanted("new", 5))
    for waited in (SETTINGS.busy_victim_wait_seconds, None):
        answer = admit(node(*models), "new", NOW, SETTINGS, waited_seconds=waited)
        assert (answer.outcome, answer.reason) == (
            AdmissionOutcome.ADMIT,
            "VictimsChosenUnderMinResident",
        )
        assert [v.uid for v in answer.victims] == ["serving"]


def test_an_idle_young_model_goes_before_waiting_for_a_busy_one() -> None:
    models = (
        busy("serving", 5, active=1, since_ago=3600),
        model("young", 5, since_ago=30, request_ago=30),
        wanted("new", 5),
    )
    answer = admit(node(*models), "new", NOW, SETTINGS, waited_seconds=0.0)
    assert (answer.outcome, answer.reason) == (
        AdmissionOutcome.ADMIT,
        "VictimsChosenUnderMinResident",
    )
    assert [v.uid for v in answer.victims] == ["young"]


def test_busy_victims_go_fewest_requests_in_flight_first() -> None:
    models = (busy("a-many", 5, active=3), busy("b-few", 5, active=1), wanted("new", 5))
    answer = admit(node(*models), "new", NOW, SETTINGS)
    assert [v.uid for v in answer.victims] == ["b-few"]


def test_the_busy_victim_wait_setting_is_checked() -> None:
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(PolicyInputError, match="busy_victim_wait_seconds"):
            PolicySettings(busy_victim_wait_seconds=bad)
    never = PolicySettings(busy_victim_wait_seconds=0.0)
    models = (busy("serving", 8, active=2), wanted("new", 5))
    answer = admit(node(*models), "new", NOW, never, waited_seconds=0.0)
    assert [v.uid for v in answer.victims] == ["serving"]


def test_a_swap_out_under_way_is_waited_for_rather_than_evicting_a_young_model() -> None:
    models = (
        model("young", 4, since_ago=30),
        model("leaving", 4, residency=Residency.SWAPPING_OUT),
        wanted("new", 5),
    )
    answer = admit(node(*models), "new", NOW, SETTINGS)
    assert (answer.outcome, answer.reason) == (AdmissionOutcome.WAIT, "WaitingForSwapOuts")


def test_room_held_by_a_loading_model_means_wait_not_refuse() -> None:
    models = (model("loading", 8, residency=Residency.LOADING), wanted("new", 5))
    answer = admit(node(*models), "new", NOW, SETTINGS)
    assert (answer.outcome, answer.reason) == (AdmissionOutcome.WAIT, "WaitingForLoads")


@pytest.mark.parametrize(
    ("residency", "outcome", "reason"),
    [
        (Residency.RESIDENT, AdmissionOutcome.ADMIT, "AlreadyResident"),
        (Residency.SWAPPING_IN, AdmissionOutcome.WAIT, "InProgress"),
        (Residency.LOADING, AdmissionOutcome.WAIT, "InProgress"),
        (Residency.SWAPPING_OUT, AdmissionOutcome.WAIT, "SwappingOut"),
    ],
)
def test_a_model_not_swapped_out_needs_no_room(
    residency: Residency, outcome: AdmissionOutcome, reason: str
) -> None:
    answer = admit(node(model("m", 4, residency=residency)), "m", NOW, SETTINGS)
    assert (answer.outcome, answer.reason, answer.victims) == (outcome, reason, ())


# --- cost, KV, clock, inputs -----------------------------------------------------------


def test_restore_cost_follows_the_link_and_preserved_kv() -> None:
    plain = replace(model("m", 50), kv_cache_bytes=50 * GiB)
    preserved = replace(plain, policy=policy(kv="preserve"))
    assert restore_seconds(plain, GPU, SETTINGS) == pytest.approx(0.05 + 50 * GiB / 50e9)
    assert restore_seconds(preserved, GPU, SETTINGS) == pytest.approx(0.05 + 100 * GiB / 50e9)
    fast = replace(GPU, host_to_device_bytes_per_second=350e9)
    assert restore_seconds(plain, fast, SETTINGS) < restore_seconds(plain, GPU, SETTINGS)


def test_kv_settings_and_host_bytes_follow_the_policy() -> None:
    preserve = policy(kv="preserve", offload_after_tokens=2048, kv_host_bytes=2 * GiB)
    settings = kv_pool_settings(preserve, kv_cache_bytes=3 * GiB)
    assert settings.to_dict() == {
        "device_bytes": 3 * GiB,
        "offload_after_tokens": 2048,
        "host_bytes": 2 * GiB,
        "preserve_on_swap_out": True,
    }
    assert host_bytes_needed(preserve, 10 * GiB, 3 * GiB) == 15 * GiB
    assert host_bytes_needed(policy(on_swap_out="drop"), 10 * GiB, 3 * GiB) == GiB


def test_the_facade_reads_its_injected_clock() -> None:
    now = [NOW - 1000]
    facade = Policy(SETTINGS, clock=lambda: now[0])
    view = node(model("m", request_ago=0))  # last request at NOW
    assert facade.swap_outs(view) == ()
    now[0] = NOW + 600
    assert [s.uid for s in facade.swap_outs(view)] == ["m"]


def test_the_facade_passes_how_long_the_caller_has_waited() -> None:
    facade = Policy(SETTINGS, clock=lambda: NOW)
    view = node(busy("serving", 8, active=1), wanted("new", 5))
    assert facade.admit(view, "new", waited_seconds=1.0).reason == "WaitingForIdle"
    assert facade.admit(view, "new").victims[0].uid == "serving"


def test_inconsistent_inputs_are_refused() -> None:
    with pytest.raises(PolicyInputError, match="resident_since"):
        ModelView(
            uid="m", gpu="gpu0", weights_bytes=1, residency=Residency.RESIDENT, policy=policy()
        )
    with pytest.raises(PolicyInputError, match="unknown GPUs"):
        NodeView(gpus=(GPU,), models=(replace(model("m"), gpu="gpu9"),))
    with pytest.raises(PolicyInputError, match="duplicate model"):
        node(model("m"), model("m"))
    with pytest.raises(PolicyInputError, match="watermarks"):
        PolicySettings(high_watermark_fraction=0.5, low_watermark_fraction=0.8)
