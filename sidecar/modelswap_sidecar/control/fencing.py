"""Fencing: an agent cut off from the cluster keeps serving but loads nothing new.

When both the agent's own Lease renewals and the operator's pushes have failed for the
grace period, the operator may already have placed this node's models elsewhere
(DESIGN.md §3). Resident models keep serving; nothing new is loaded or swapped in until
either signal comes back. Local mode has neither signal and disables fencing.

Pure: the caller passes the time (one monotonic clock for all three calls).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Fencing:
    grace_seconds: float
    enabled: bool = True
    last_lease_renewal_seconds: float
    last_push_seconds: float

    @classmethod
    def starting(cls, now_seconds: float, grace_seconds: float, *, enabled: bool) -> Fencing:
        """At start both signals count as just seen: a fresh agent gets one grace period."""
        if grace_seconds <= 0:
            raise ValueError("grace_seconds must be positive")
        return cls(
            grace_seconds=grace_seconds,
            enabled=enabled,
            last_lease_renewal_seconds=now_seconds,
            last_push_seconds=now_seconds,
        )

    def lease_renewed(self, now_seconds: float) -> Fencing:
        latest = max(self.last_lease_renewal_seconds, now_seconds)
        return dataclasses.replace(self, last_lease_renewal_seconds=latest)

    def pushed(self, now_seconds: float) -> Fencing:
        return dataclasses.replace(self, last_push_seconds=max(self.last_push_seconds, now_seconds))

    def fenced(self, now_seconds: float) -> bool:
        if not self.enabled:
            return False
        lease_age = now_seconds - self.last_lease_renewal_seconds
        push_age = now_seconds - self.last_push_seconds
        return lease_age >= self.grace_seconds and push_age >= self.grace_seconds

    def may_load_new(self, now_seconds: float) -> bool:
        return not self.fenced(now_seconds)
