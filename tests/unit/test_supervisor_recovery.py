"""The recovery time the supervisor promises (docs/NODE.md): a killed child starts again
within `max_backoff_seconds` (4 s) of its exit however often it was killed before, and a
crash loop neither spins nor runs forever (issue 12, finding 10)."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from modelswap_sidecar.supervisor.core import Supervisor
from modelswap_sidecar.supervisor.restarts import (
    GiveUp,
    Restart,
    RestartHistory,
    RestartPolicy,
    after_exit,
    give_up_note,
)
from modelswap_sidecar.supervisor.specs import ChildSpec

PROMISED_RESTART_SECONDS = 4.0


def test_kills_at_random_times_are_restarted_within_the_promise() -> None:
    policy = RestartPolicy(give_up_after_restarts=None)
    rng = random.Random(12)
    history, now = RestartHistory(), 0.0
    for _ in range(200):
        started = now
        now += rng.uniform(0.5, 60.0)  # killed at a time the test does not choose
        decision = after_exit(policy, history, started_seconds=started, exited_seconds=now)
        assert isinstance(decision, Restart)
        assert decision.delay_seconds <= PROMISED_RESTART_SECONDS
        history, now = decision.history, now + decision.delay_seconds


def test_a_child_that_ran_ten_seconds_starts_over_at_half_a_second() -> None:
    policy = RestartPolicy()
    history = RestartHistory(quick_exits=8)
    decision = after_exit(policy, history, started_seconds=0.0, exited_seconds=10.0)
    assert isinstance(decision, Restart) and decision.delay_seconds == 0.5


def test_a_crash_loop_does_not_spin_and_is_given_up() -> None:
    policy = RestartPolicy()
    history, now, delays = RestartHistory(), 0.0, []
    while True:
        decision = after_exit(policy, history, started_seconds=now, exited_seconds=now + 0.1)
        if isinstance(decision, GiveUp):
            break
        delays.append(decision.delay_seconds)
        history, now = decision.history, now + 0.1 + decision.delay_seconds
    assert len(delays) == policy.give_up_after_restarts == 10
    assert min(delays) >= 0.5 and max(delays) == PROMISED_RESTART_SECONDS


def test_each_restart_says_how_close_the_node_is_to_giving_up() -> None:
    """A crash a client's request caused counts towards the give-up like any other: the log
    says so at each restart (issue 26, item 1)."""
    policy = RestartPolicy(give_up_after_restarts=3, give_up_window_seconds=60.0)
    decision = after_exit(policy, RestartHistory(), started_seconds=0.0, exited_seconds=1.0)
    assert isinstance(decision, Restart) and decision.restarts_in_window == 1
    assert give_up_note(policy, decision) == (
        "restart 1 of 3 allowed within 60 s before the supervisor gives up"
    )
    again = after_exit(policy, decision.history, started_seconds=2.0, exited_seconds=3.0)
    assert isinstance(again, Restart)
    assert give_up_note(policy, again).startswith("restart 2 of 3 ")
    never = RestartPolicy(give_up_after_restarts=None)
    endless = after_exit(never, RestartHistory(), started_seconds=0.0, exited_seconds=1.0)
    assert isinstance(endless, Restart)
    assert give_up_note(never, endless) == "restart 1; the supervisor never gives up"


def test_the_supervisor_warns_of_each_counted_restart(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    crashing = ChildSpec(name="crasher", argv=("/bin/sh", "-c", "exit 3"), cwd=tmp_path)
    policy = RestartPolicy(
        initial_backoff_seconds=0.0, max_backoff_seconds=0.0, give_up_after_restarts=2
    )
    supervisor = Supervisor([crashing], policy=policy, stop_grace_seconds=1.0,
                            reap_orphans=False)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="modelswap_sidecar.supervisor.core"):
        assert supervisor.run() == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    counted = [m for m in warnings if m.startswith("restarting crasher")]
    assert counted == [
        "restarting crasher in 0.00 s (restart 1 of 2 allowed within 600 s before the "
        "supervisor gives up)",
        "restarting crasher in 0.00 s (restart 2 of 2 allowed within 600 s before the "
        "supervisor gives up)",
    ]
