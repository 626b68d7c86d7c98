"""Stop sequences applied to streamed text (pure).

The text a model streams arrives in pieces; the answer must end before the first stop
sequence even when one spans pieces, and what the client is sent must never be taken
back. So a `StopScanner` passes text on as soon as it cannot be the start of a stop
sequence and holds back only the longest tail that could still become one (at most the
longest stop's length less one character). Pieces are `str` (decoded by the event
parser once their whole line is in, so a multibyte character split between network
chunks is whole here) and text is held and cut by characters, so a character is never
split.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopScanner:
    """Feed text pieces; get the text that is final, until a stop sequence is seen."""

    __slots__ = ("_held", "_stops", "stopped")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The text now safe to send: everything before a stop sequence (then `stopped`
        is True and later pieces give ""), less a tail that could start one."""
        if self.stopped:
            return ""
        text = self._held + piece
        cut = first_stop(text, self._stops)
        if cut is not None:
            self.stopped, self._held = True, ""
            return text[:cut]
        keep = held_tail(text, self._stops)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def finish(self) -> str:
        """The held tail once the text has ended (it did not become a stop sequence)."""
        rest, self._held = self._held, ""
        return "" if self.stopped else rest


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop sequence in `text` begins (None: none is in it)."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def held_tail(text: str, stops: Sequence[str]) -> int:
    """How many of `text`'s last characters could be the start of a stop sequence: the
    longest k < len(stop) with text ending in stop[:k]."""
    return max(
        (
            k
            for s in stops
            for k in range(min(len(s) - 1, len(text)), 0, -1)
            if text.endswith(s[:k])
        ),
        default=0,
    )
