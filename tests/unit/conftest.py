"""The gateway's tests run on both event loops it meets: asyncio's own and uvloop's, the
agent's (`agent.running.new_event_loop`), whose transports behave differently in places
(pausing, closing, `get_extra_info`). Every other async test runs on asyncio's own loop
(pytest-asyncio wants a factory for every test once the hook exists)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

from modelswap_sidecar.agent.running import new_event_loop

_ASYNCIO: Mapping[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop
}
_BOTH_LOOPS: Mapping[str, Callable[[], asyncio.AbstractEventLoop]] = {
    **_ASYNCIO,
    "uvloop": new_event_loop,
}


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    if item.path.name.startswith(("test_gateway_", "test_reliability_gateway_")):
        return _BOTH_LOOPS
    return _ASYNCIO
