"""The grace period of models missing from the desired set.

A model held by the node but absent from the latest set is unloaded only once it has been
absent for `grace_seconds` (an operator restarting, or a set built from a cache still
filling, must not unload a fleet). It comes off the schedule the moment it reappears.
Its host-store bytes stay until `DELETE /v1/models/{uid}`.

Pure and immutable: every change returns a new schedule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class UnloadSchedule:
    grace_seconds: float
    deadlines: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def observe(
        self, present: Iterable[str], held: Iterable[str], now_seconds: float
    ) -> UnloadSchedule:
        """After a set arrives: `present` uids leave the schedule; `held` uids missing from
        it are scheduled (once: a later set does not push an existing deadline back)."""
        present = frozenset(present)
        deadlines = {uid: t for uid, t in self.deadlines.items() if uid not in present}
        for uid in sorted(frozenset(held) - present):
            deadlines.setdefault(uid, now_seconds + self.grace_seconds)
        return UnloadSchedule(self.grace_seconds, MappingProxyType(deadlines))

    def due(self, now_seconds: float) -> tuple[str, ...]:
        return tuple(sorted(uid for uid, t in self.deadlines.items() if t <= now_seconds))

    def without(self, uid: str) -> UnloadSchedule:
        deadlines = {u: t for u, t in self.deadlines.items() if u != uid}
        return UnloadSchedule(self.grace_seconds, MappingProxyType(deadlines))

    def remaining_seconds(self, uid: str, now_seconds: float) -> float | None:
        deadline = self.deadlines.get(uid)
        return None if deadline is None else max(deadline - now_seconds, 0.0)
