"""Server-sent events: an incremental parser for Triton's `generate_stream` and the lines
the gateway writes (data events, named events, comments).

Only what the gateway needs of the format (https://html.spec.whatwg.org/#server-sent-events):
events end at a blank line; `data:` lines are joined with newlines; `event:` names one;
lines starting with `:` are comments; other fields are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

CONTENT_TYPE = "text/event-stream"
#: Headers of every event stream the gateway sends: no caching, no proxy buffering.
STREAM_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


@dataclass(frozen=True)
class Event:
    data: str
    event: str = "message"


class EventParser:
    """Feed bytes as they arrive; get each complete event once its blank line is in."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event = "message"

    def feed(self, chunk: bytes) -> Iterator[Event]:
        self._buffer += chunk
        while True:
            index = self._buffer.find(b"\n")
            if index < 0:
                return
            raw, self._buffer = self._buffer[:index], self._buffer[index + 1 :]
            line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            if not line:
                if self._data:
                    yield Event("\n".join(self._data), self._event)
                self._data = []
                self._event = "message"
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                self._data.append(value)
            elif field == "event":
                self._event = value

    def close(self) -> Iterator[Event]:
        """An event left without its blank line when the stream ended."""
        if self._buffer:
            yield from self.feed(b"\n")
        if self._data:
            yield Event("\n".join(self._data), self._event)
        self._data = []


def data_event(data: str, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    body = "".join(f"data: {line}\n" for line in data.split("\n"))
    return (head + body + "\n").encode()


def comment(text: str) -> bytes:
    return "".join(f": {line}\n" for line in text.split("\n")).encode() + b"\n"
