"""Seeded fault injection: the emulator answers some resource requests 409, 429 or 500, or
holds them and answers 504 as the real server does when a request outlives its timeout.

`KubeEmulator(faults=FaultRates(conflict=0.05, throttle=0.05, internal=0.05, timeout=0.02,
seed=7))`, or `emulator.inject(rates)` / `inject(None)` while it serves. Each resource
request (not discovery, `/version`, `/healthz` or `/emulator/…`) draws once from a
`random.Random(seed)`: the rates are probabilities that add up to at most 1, so one seed
gives one sequence of faults for one sequence of requests. A conflict drawn by a read
(get, list, watch) is no fault: the real server answers 409 only to writes (a stale
resourceVersion, a name taken). Watches are failed only by status (never held): a held
watch is indistinguishable from a quiet one. A failed request changes nothing in the
store, and its record in the request log carries `fault`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tests.support.kube_emulator.errors import ApiError

#: The real server's wording for each injected answer.
_MESSAGES = {
    409: "Operation cannot be fulfilled: the object has been modified; please apply your "
    "changes to the latest version and try again",
    429: "Too many requests, please try again later.",
    500: "Internal error occurred: injected fault",
    504: "Timeout: request did not complete within requested timeout - context deadline exceeded",
}
_REASONS = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError", 504: "Timeout"}


@dataclass(frozen=True)
class FaultRates:
    """Probabilities per resource request (each in [0, 1], summing to at most 1)."""

    conflict: float = 0.0  # 409 Conflict
    throttle: float = 0.0  # 429 TooManyRequests with Retry-After
    internal: float = 0.0  # 500 InternalError
    timeout: float = 0.0  # held `timeout_seconds`, then 504 Timeout
    seed: int = 0
    timeout_seconds: float = 5.0
    retry_after_seconds: int = 1
    #: When given, only requests whose path contains one of these draw (e.g. one node's
    #: Lease, to let it go stale while everything else works).
    paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        rates = (self.conflict, self.throttle, self.internal, self.timeout)
        if any(r < 0 or r > 1 for r in rates) or sum(rates) > 1:
            raise ValueError(f"fault rates must lie in [0, 1] and sum to at most 1: {rates}")


@dataclass(frozen=True)
class Fault:
    code: int
    hold_seconds: float = 0.0

    def error(self, retry_after_seconds: int) -> ApiError:
        details = {"retryAfterSeconds": retry_after_seconds} if self.code == 429 else None
        return ApiError(
            self.code, _MESSAGES[self.code], reason=_REASONS[self.code], details=details
        )


class FaultInjector:
    """Draws the fault (or none) for each request, in arrival order."""

    def __init__(self, rates: FaultRates) -> None:
        self.rates = rates
        self._random = random.Random(rates.seed)
        self.injected: dict[int, int] = {}

    def draw(
        self, *, resource_request: bool, watch: bool, write: bool = True, path: str = ""
    ) -> Fault | None:
        if not resource_request:
            return None
        if self.rates.paths and not any(p in path for p in self.rates.paths):
            return None
        r = self._random.random()
        rates = self.rates
        cut = 0.0
        for code, rate in ((409, rates.conflict), (429, rates.throttle), (500, rates.internal),
                           (504, rates.timeout)):  # fmt: skip
            cut += rate
            if r < cut:
                if (code == 504 and watch) or (code == 409 and not write):
                    return None  # see the module docstring
                self.injected[code] = self.injected.get(code, 0) + 1
                hold = rates.timeout_seconds if code == 504 else 0.0
                return Fault(code, hold)
        return None
