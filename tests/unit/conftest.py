"""The gateway's tests run on both event loops it meets: asyncio's own (what the unit
tests of everything else use) and uvloop's, the agent's (`agent.running.new_event_loop`),
whose transports behave differently in places (pausing, closing, `get_extra_info`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

from modelswap_sidecar.agent.running import new_event_loop

_BOTH_LOOPS: Mapping[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": new_event_loop,
}


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]] | None:
    if item.path.name.startswith(("test_gateway_", "test_reliability_gateway_")):
        return _BOTH_LOOPS
    return None
