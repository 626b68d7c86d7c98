"""The recovery time the supervisor promises (docs/NODE.md): a killed child starts again
within `max_backoff_seconds` (4 s) of its exit however often it was killed before, and a
crash loop neither spins nor runs forever (issue 12, finding 10)."""

from __future__ import annotations

import random

from modelswap_sidecar.supervisor.restarts import (
    GiveUp,
    Restart,
    RestartHistory,
    RestartPolicy,
    after_exit,
)

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
