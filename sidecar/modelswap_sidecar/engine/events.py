"""What the engine tells its listeners: one `SwapEvent` per swap-in or swap-out that
completed, with its real duration, emitted from the thread that did it (before the call
that started it returns). The agent records swaps and metrics from these, at the source."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


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


class SwapEvents:
    """The listeners of the engine's swaps. Subscribed at assembly, before any swap."""

    def __init__(self) -> None:
        self._listeners: list[SwapListener] = []

    def subscribe(self, listener: SwapListener) -> None:
        """Call `listener` with every completed swap (from the thread that did it)."""
        self._listeners.append(listener)

    def emit(self, event: SwapEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("swap listener failed on %s", event)
