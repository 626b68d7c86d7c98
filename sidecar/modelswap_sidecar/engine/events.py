"""What the engine tells its listeners: one `SwapEvent` per swap-in or swap-out that
completed, with its real duration, emitted from the thread that did it (before the call
that started it returns). The agent records swaps and metrics from these, at the source."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass


class SwapKind(enum.StrEnum):
    IN = "in"
    OUT = "out"


#: The cause of a swap-out the engine made by itself to make room for a swap-in.
MAKE_ROOM = "MakeRoom"


@dataclass(frozen=True, kw_only=True, slots=True)
class SwapEvent:
    #: The engine's model name (the Triton model name).
    model: str
    kind: SwapKind
    seconds: float
    #: Why a swap-out happened (`Idle`, `Manual`, `MakeRoom`, ...); empty for swap-ins.
    cause: str = ""
    #: The swap-out dropped the model (onSwapOut: drop) rather than keep its host copy.
    dropped: bool = False


SwapListener = Callable[[SwapEvent], None]
