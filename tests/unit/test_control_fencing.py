"""Fencing (Lease renewals and pushes both failing) and the unload grace schedule: pure."""

from __future__ import annotations

import pytest

from modelswap_sidecar.control.fencing import Fencing
from modelswap_sidecar.control.removals import UnloadSchedule

GRACE = 60.0


def test_a_fresh_agent_gets_one_grace_period_before_it_is_fenced() -> None:
    fencing = Fencing.starting(100.0, GRACE, enabled=True)
    assert fencing.may_load_new(100.0 + GRACE - 0.001)
    assert fencing.fenced(100.0 + GRACE)


@pytest.mark.parametrize("signal", ["lease", "push"])
def test_either_signal_alone_keeps_the_agent_unfenced(signal: str) -> None:
    fencing = Fencing.starting(0.0, GRACE, enabled=True)
    for now in (30.0, 60.0, 90.0, 120.0):
        fencing = fencing.lease_renewed(now) if signal == "lease" else fencing.pushed(now)
        assert fencing.may_load_new(now + GRACE - 1)
    assert fencing.fenced(120.0 + GRACE)


def test_fenced_only_when_both_have_failed_for_the_grace_period() -> None:
    fencing = Fencing.starting(0.0, GRACE, enabled=True).lease_renewed(50.0).pushed(20.0)
    assert not fencing.fenced(100.0)  # the push is 80 s old, the renewal 50 s
    assert fencing.fenced(110.0)
    assert not fencing.pushed(111.0).fenced(111.0)  # a push lifts it at once


def test_a_late_or_reordered_report_never_moves_a_signal_back() -> None:
    fencing = Fencing.starting(0.0, GRACE, enabled=True).lease_renewed(100.0).lease_renewed(10.0)
    assert fencing.last_lease_renewal_seconds == 100.0


def test_local_mode_is_never_fenced() -> None:
    assert Fencing.starting(0.0, GRACE, enabled=False).may_load_new(10**9)


def test_grace_must_be_positive() -> None:
    with pytest.raises(ValueError, match="grace"):
        Fencing.starting(0.0, 0.0, enabled=True)


def test_missing_models_are_due_after_the_grace_and_not_before() -> None:
    schedule = UnloadSchedule(GRACE).observe(present={"a"}, held={"a", "b", "c"}, now_seconds=10)
    assert schedule.due(10 + GRACE - 0.5) == ()
    assert schedule.due(10 + GRACE) == ("b", "c")
    assert schedule.remaining_seconds("b", 40) == GRACE - 30
    assert schedule.remaining_seconds("a", 40) is None


def test_a_later_set_does_not_push_a_deadline_back_and_a_return_cancels_it() -> None:
    schedule = UnloadSchedule(GRACE).observe(present=set(), held={"b"}, now_seconds=0)
    schedule = schedule.observe(present=set(), held={"b"}, now_seconds=30)
    assert schedule.due(GRACE) == ("b",)
    assert schedule.observe(present={"b"}, held={"b"}, now_seconds=31).due(10**6) == ()
    assert schedule.without("b").deadlines == {}
    assert schedule.deadlines == {"b": GRACE}  # every change is a new schedule
