"""When to restart a child that exited, and when to give up (pure: the caller passes times).

A child that exits is restarted after a backoff that doubles with each quick exit in a row
(`initial_backoff_seconds` · `backoff_factor`ⁿ, at most `max_backoff_seconds`). A child
that ran for `healthy_after_seconds` before exiting starts over at the initial backoff.
When one child has been restarted `give_up_after_restarts` times within
`give_up_window_seconds`, the supervisor gives up: it stops everything and exits non-zero,
so the kubelet (or the user, in local mode) sees a crash loop instead of a node that only
looks alive. Every restart says what it counts towards (`give_up_note`): a child brought
down by what a client sent (a request that crashes Triton) counts like any other crash, so
the supervisor's log shows how close the node is to giving up, and the gateway logs and
counts the requests Triton held when its connection broke
(`modelswap_gateway_upstream_lost_total`), which names the likely cause.

All times are seconds on one monotonic clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RestartPolicy:
    initial_backoff_seconds: float = 0.5
    #: The longest a killed child waits to start again: the recovery time the node promises
    #: (docs/NODE.md) is this plus the child's own start. A crash loop is bounded by the
    #: give-up below, not by a long wait.
    max_backoff_seconds: float = 4.0
    backoff_factor: float = 2.0
    #: A child that ran at least this long before exiting counts as healthy: backoff resets.
    healthy_after_seconds: float = 10.0
    #: Give up after this many restarts of one child within the window; None: never.
    give_up_after_restarts: int | None = 10
    give_up_window_seconds: float = 600.0

    def __post_init__(self) -> None:
        if self.initial_backoff_seconds < 0 or self.max_backoff_seconds < 0:
            raise ValueError("backoff seconds must not be negative")
        if self.max_backoff_seconds < self.initial_backoff_seconds:
            raise ValueError("max_backoff_seconds must be at least initial_backoff_seconds")
        if self.backoff_factor < 1:
            raise ValueError("backoff_factor must be at least 1")
        if self.healthy_after_seconds < 0 or self.give_up_window_seconds <= 0:
            raise ValueError("healthy_after_seconds and give_up_window_seconds must be positive")
        if self.give_up_after_restarts is not None and self.give_up_after_restarts < 1:
            raise ValueError("give_up_after_restarts must be at least 1 (or None: never)")


@dataclass(frozen=True)
class RestartHistory:
    """What the policy remembers of one child."""

    #: Quick exits in a row (the backoff exponent).
    quick_exits: int = 0
    #: When it was restarted, within the give-up window of the last decision.
    restart_times: tuple[float, ...] = ()


@dataclass(frozen=True)
class Restart:
    delay_seconds: float
    history: RestartHistory

    @property
    def restarts_in_window(self) -> int:
        """Restarts within the give-up window, this one included."""
        return len(self.history.restart_times)


def give_up_note(policy: RestartPolicy, restart: Restart) -> str:
    """What `restart` counts towards, for the log."""
    limit = policy.give_up_after_restarts
    if limit is None:
        return f"restart {restart.restarts_in_window}; the supervisor never gives up"
    return (
        f"restart {restart.restarts_in_window} of {limit} allowed within "
        f"{policy.give_up_window_seconds:g} s before the supervisor gives up"
    )


@dataclass(frozen=True)
class GiveUp:
    reason: str


def after_exit(
    policy: RestartPolicy,
    history: RestartHistory,
    *,
    started_seconds: float,
    exited_seconds: float,
) -> Restart | GiveUp:
    """Decide what follows the exit of a child that was started at `started_seconds`."""
    ran_seconds = exited_seconds - started_seconds
    quick_exits = 0 if ran_seconds >= policy.healthy_after_seconds else history.quick_exits
    window_start = exited_seconds - policy.give_up_window_seconds
    recent = tuple(t for t in history.restart_times if t > window_start)
    limit = policy.give_up_after_restarts
    if limit is not None and len(recent) >= limit:
        return GiveUp(
            f"restarted {len(recent)} times in the last {policy.give_up_window_seconds:g} s"
        )
    delay = min(
        policy.max_backoff_seconds,
        # The exponent is capped: the delay reached the maximum long before.
        policy.initial_backoff_seconds * policy.backoff_factor ** min(quick_exits, 64),
    )
    return Restart(delay, RestartHistory(quick_exits + 1, (*recent, exited_seconds)))
