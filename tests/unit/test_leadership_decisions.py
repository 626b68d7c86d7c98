"""The leader election's pure decisions: what an operator does with the Lease it read.

A wrong decision here is two leaders (taking a fresh Lease), no leader (never taking an
expired one), or a term that does not rise (agents refuse the new leader's desired sets).
"""

from __future__ import annotations

from typing import Any

import pytest

from modelswap_operator.leadership import (
    Create,
    LeaderElector,
    Lost,
    Renew,
    TakeOver,
    Wait,
    decide,
    expires_at,
    micro_time,
    parse_micro_time,
    unique_identity,
)

NOW = 1_700_000_000.25  # epoch seconds
DURATION_SECONDS = 15


def lease(holder: str | None, renewed_seconds_ago: float, transitions: int = 3) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "leaseDurationSeconds": DURATION_SECONDS,
        "acquireTime": micro_time(NOW - 100),
        "renewTime": micro_time(NOW - renewed_seconds_ago),
        "leaseTransitions": transitions,
    }
    if holder is not None:
        spec["holderIdentity"] = holder
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "modelswap-operator", "resourceVersion": "7"},
            "spec": spec}  # fmt: skip


def test_an_absent_lease_is_created_in_term_zero() -> None:
    action = decide(None, "op-a", NOW, lease_duration_seconds=DURATION_SECONDS)
    assert isinstance(action, Create)
    assert action.spec == {
        "holderIdentity": "op-a",
        "leaseDurationSeconds": DURATION_SECONDS,
        "acquireTime": micro_time(NOW),
        "renewTime": micro_time(NOW),
        "leaseTransitions": 0,
    }


def test_an_expired_lease_is_taken_over_in_the_next_term() -> None:
    action = decide(lease("op-b", 15.01), "op-a", NOW, lease_duration_seconds=10)
    assert isinstance(action, TakeOver)
    assert action.spec["holderIdentity"] == "op-a"
    assert action.spec["leaseTransitions"] == 4
    assert action.spec["acquireTime"] == action.spec["renewTime"] == micro_time(NOW)
    assert action.spec["leaseDurationSeconds"] == 10  # ours from now on


def test_a_fresh_lease_of_another_holder_is_waited_for_until_it_expires() -> None:
    action = decide(lease("op-b", 5), "op-a", NOW, lease_duration_seconds=DURATION_SECONDS)
    assert isinstance(action, Wait)
    assert action.holder == "op-b"
    assert action.expires_in_seconds == pytest.approx(10, abs=1e-3)


def test_expiry_follows_the_holders_duration_not_ours() -> None:
    # The holder wrote 15 s; a candidate configured with 5 s must still wait.
    action = decide(lease("op-b", 6), "op-a", NOW, lease_duration_seconds=5)
    assert isinstance(action, Wait)


def test_a_released_lease_is_taken_over_at_once() -> None:
    action = decide(lease(None, 0.1), "op-a", NOW, lease_duration_seconds=DURATION_SECONDS)
    assert isinstance(action, TakeOver) and action.spec["leaseTransitions"] == 4
    empty = decide(lease("", 0.1), "op-a", NOW, lease_duration_seconds=DURATION_SECONDS)
    assert isinstance(empty, TakeOver)


def test_a_lease_without_times_counts_as_expired() -> None:
    bare = {"spec": {"holderIdentity": "op-b"}}
    action = decide(bare, "op-a", NOW, lease_duration_seconds=DURATION_SECONDS)
    assert isinstance(action, TakeOver) and action.spec["leaseTransitions"] == 1
    assert expires_at(bare["spec"]) is None


def test_the_leader_renews_its_own_lease_in_the_same_term() -> None:
    held = lease("op-a", 5)
    action = decide(held, "op-a", NOW, lease_duration_seconds=DURATION_SECONDS, leading=True)
    assert isinstance(action, Renew)
    assert action.spec["renewTime"] == micro_time(NOW)
    assert action.spec["leaseTransitions"] == 3
    assert action.spec["acquireTime"] == held["spec"]["acquireTime"]


def test_the_leader_renews_even_past_expiry_while_the_lease_still_names_it() -> None:
    # Nobody took it (the write carries the resourceVersion read, so a taker in between
    # makes it a Conflict instead).
    action = decide(lease("op-a", 60), "op-a", NOW, lease_duration_seconds=DURATION_SECONDS,
                    leading=True)  # fmt: skip
    assert isinstance(action, Renew)


def test_the_leader_has_lost_when_the_lease_names_another_or_is_gone() -> None:
    taken = decide(lease("op-b", 0), "op-a", NOW, lease_duration_seconds=DURATION_SECONDS,
                   leading=True)  # fmt: skip
    assert taken == Lost(holder="op-b")
    released = decide(lease(None, 0), "op-a", NOW, lease_duration_seconds=DURATION_SECONDS,
                      leading=True)  # fmt: skip
    assert released == Lost(holder="")
    gone = decide(None, "op-a", NOW, lease_duration_seconds=DURATION_SECONDS, leading=True)
    assert gone == Lost(holder="")


def test_acquiring_a_lease_that_still_names_us_starts_a_new_term() -> None:
    # E.g. after renewals failed and leadership was given up: the counter restarts, so
    # the term must rise or agents refuse the new revisions as older.
    action = decide(lease("op-a", 1), "op-a", NOW, lease_duration_seconds=DURATION_SECONDS)
    assert isinstance(action, TakeOver) and action.spec["leaseTransitions"] == 4


def test_identities_are_unique_per_process_start() -> None:
    first, second = (
        unique_identity("modelswap-operator-7d9f"),
        unique_identity("modelswap-operator-7d9f"),
    )
    assert first != second
    assert first.startswith("modelswap-operator-7d9f-")
    assert unique_identity()  # the host name stands in for a pod name


def test_micro_times_round_trip_and_read_the_servers_forms() -> None:
    text = micro_time(NOW)
    assert text == "2023-11-14T22:13:20.250000Z"
    assert parse_micro_time(text) == NOW
    assert parse_micro_time("2023-11-14T22:13:20Z") == NOW - 0.25
    assert parse_micro_time("2023-11-14T23:13:20.250000+01:00") == NOW


def test_the_elector_refuses_settings_that_cannot_hold_a_lease() -> None:
    with pytest.raises(ValueError, match="below the lease duration"):
        LeaderElector(None, "ns", "lease", "op-a", lease_duration_seconds=1,
                      renew_interval_seconds=1)  # fmt: skip
    with pytest.raises(ValueError, match="at least 1"):
        LeaderElector(None, "ns", "lease", "op-a", lease_duration_seconds=0)
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(None, "ns", "lease", "")
