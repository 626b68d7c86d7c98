"""What the policy decides: swap-outs to start now, and the answer to a swap-in request."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class SwapOutReason(enum.StrEnum):
    IDLE = "Idle"  # idleAfter elapsed
    PRESSURE = "Pressure"  # the GPU is above its high watermark
    MAKE_ROOM = "MakeRoom"  # a victim chosen so a requested model fits


@dataclass(frozen=True, kw_only=True)
class SwapOut:
    """Swap `uid` out of `gpu` now; `drop` when its policy is `onSwapOut: drop`."""

    uid: str
    gpu: str
    reason: SwapOutReason
    message: str
    bytes_freed: int
    drop: bool = False


class AdmissionOutcome(enum.StrEnum):
    ADMIT = "admit"  # swap in now, after swapping out `victims` (maybe none)
    WAIT = "wait"  # room will come: ask again when a swap or load finishes
    REFUSE = "refuse"  # it cannot fit; waiting does not help


@dataclass(frozen=True, kw_only=True)
class Admission:
    """Answer to "model `uid` is wanted on its GPU": admit (with victims), wait, refuse.

    `reason` is CamelCase for machines; `message` says the numbers for people.
    """

    uid: str
    outcome: AdmissionOutcome
    reason: str
    message: str
    victims: tuple[SwapOut, ...] = ()

    @property
    def bytes_freed(self) -> int:
        return sum(v.bytes_freed for v in self.victims)
