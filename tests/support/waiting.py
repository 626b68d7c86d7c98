"""Waiting on a condition with a deadline (never a bare sleep as synchronisation)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

T = TypeVar("T")


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
