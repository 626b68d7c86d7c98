"""Waiting on a condition with a deadline (never a bare sleep as synchronisation).

- `wait_for(probe, timeout_seconds, what)`: from a thread (a plain test, a fixture);
- `until(probe, what, timeout_seconds)`: from a coroutine, a blocking probe run off the loop;
- `until_on_loop(probe, what, timeout_seconds)`: from a coroutine, a quick probe of state the
  loop itself changes, called on the loop between yields;
- `until_async(probe, what, timeout_seconds)`: from a coroutine, a probe that is a coroutine.

Both poll until the probe answers something truthy, return that answer, and fail at the
deadline naming `what`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

T = TypeVar("T")

#: Between two looks of `wait_for`.
POLL_SECONDS = 0.02


def wait_for(
    probe: Callable[[], T | None], timeout_seconds: float = 20.0, what: str = "condition"
) -> T:
    """Call `probe` until it answers something truthy (returned); fail at the deadline
    naming `what`."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds:g} s waiting for {what}")
        time.sleep(POLL_SECONDS)


async def until(probe: Callable[[], T], what: str, timeout_seconds: float = 60.0) -> T:
    """Poll a blocking probe (run off the event loop) until it answers something truthy;
    fail at the deadline naming `what` and the last answer."""
    deadline = time.monotonic() + timeout_seconds
    last: Any = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(probe)
        if last:
            return cast(T, last)
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


async def until_on_loop(
    probe: Callable[[], T], what: str, timeout_seconds: float = 20.0, *, poll_seconds: float = 0.005
) -> T:
    """Call `probe` on the loop, yielding between looks, until it answers something truthy.
    A probe that blocks (a request) holds the loop: give it a longer `poll_seconds`."""
    deadline = time.monotonic() + timeout_seconds
    while not (found := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds:g} s waiting for {what}")
        await asyncio.sleep(poll_seconds)
    return found


async def until_async(
    probe: Callable[[], Awaitable[T]],
    what: str,
    timeout_seconds: float = 20.0,
    *,
    poll_seconds: float = 0.02,
) -> T:
    """Await `probe()` until it answers something truthy; fail at the deadline naming
    `what` and the last answer. A costly probe (a request, a scan of /proc) takes a longer
    `poll_seconds`."""
    deadline = time.monotonic() + timeout_seconds
    while not (found := await probe()):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_seconds:g} s waiting for {what} (last: {found!r})"
            )
        await asyncio.sleep(poll_seconds)
    return found
