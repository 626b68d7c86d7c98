"""The model's handlers for swap-out, swap-in and readopt (`Attachment.on_*`)."""

from __future__ import annotations

from collections.abc import Callable

Hook = Callable[[], None]


class Hooks:
    """Handlers in the order they were added; each event runs them all, on the thread
    that saw it (an exception propagates to that thread's caller)."""

    def __init__(self) -> None:
        self.swap_out: list[Hook] = []
        self.swap_in: list[Hook] = []
        self.readopt: list[Hook] = []

    @staticmethod
    def run(hooks: list[Hook]) -> None:
        for hook in hooks:
            hook()
