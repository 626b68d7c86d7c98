"""A `ModelDirectory` whose swap-ins a test controls, and a gateway served on loopback.

`RouteTable` answers a directory's `lookup` and `routes` from a route set (the routing
module's pure `resolve`).

`FakeDirectory` counts `ensure_resident` calls per model, can hold a model's swap-in until
the test releases it, can fail it, and can run a real action (e.g. a Triton load) as the
swap-in itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from modelswap_sidecar.gateway.app import GatewayApp, bound_port, make_app, start
from modelswap_sidecar.gateway.context import Gateway
from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.errors import SwapInFailedError
from modelswap_sidecar.gateway.routing import resolve
from modelswap_sidecar.gateway.settings import GatewaySettings
from modelswap_sidecar.triton.naming import triton_model_name


def route(
    name: str,
    namespace: str = "team-a",
    *,
    uid: str | None = None,
    decoupled: bool = False,
    max_queued: int = 100,
    queue_timeout_seconds: float | None = 60.0,
) -> ModelRoute:
    uid = uid or str(uuid.uuid4())
    return ModelRoute(
        uid=uid,
        namespace=namespace,
        name=name,
        triton_name=triton_model_name(uid),
        decoupled=decoupled,
        max_queued=max_queued,
        queue_timeout_seconds=queue_timeout_seconds,
    )


class RouteTable:
    """`lookup` and `routes` of a `ModelDirectory` over a route set a test replaces whole."""

    def __init__(self, routes: Iterable[ModelRoute] = ()) -> None:
        self._lock = threading.Lock()
        self._routes: tuple[ModelRoute, ...] = tuple(routes)

    def replace(self, routes: Iterable[ModelRoute]) -> None:
        with self._lock:
            self._routes = tuple(routes)

    def lookup(self, name: str, namespace: str | None) -> ModelRoute:
        return resolve(self._routes, name, namespace)

    def routes(self, namespace: str | None) -> Sequence[ModelRoute]:
        current = self._routes
        if namespace is None:
            return current
        return tuple(route for route in current if route.namespace == namespace)

    def by_uid(self, uid: str) -> ModelRoute | None:
        return next((route for route in self._routes if route.uid == uid), None)


class FakeDirectory:
    def __init__(self, routes: Iterable[ModelRoute], *, resident: Iterable[str] = ()) -> None:
        self.table = RouteTable(routes)
        self.resident: set[str] = set(resident)
        self.states: dict[str, str] = {}
        self.swap_ins: Counter[str] = Counter()  # ensure_resident calls
        self.completed: Counter[str] = Counter()  # swap-ins that finished
        self.requests: list[tuple[str, float]] = []
        #: requests admitted and not yet answered, per model
        self.in_flight: Counter[str] = Counter()
        self.failure: dict[str, Exception] = {}
        #: Run as the swap-in itself (after any hold), e.g. a real Triton load.
        self.action: Callable[[str], Awaitable[None]] | None = None
        self._holds: dict[str, asyncio.Event] = {}
        self._stale: set[str] = set()

    # -- what a test turns
    def hold(self, uid: str) -> None:
        self._holds[uid] = asyncio.Event()

    def release(self, uid: str) -> None:
        self._holds[uid].set()

    def stale_once(self, uid: str) -> None:
        """The next `is_resident` answers True although the model is gone (a swap-out that
        raced with the request's admission)."""
        self._stale.add(uid)

    def swap_out(self, uid: str) -> None:
        self.resident.discard(uid)
        self.states[uid] = "SWAPPED_OUT"

    # -- ModelDirectory
    #: False: the node does not know its desired set yet (`/v2/health/ready` is 503)
    knows = True

    def knows_desired(self) -> bool:
        return self.knows

    def lookup(self, name: str, namespace: str | None) -> ModelRoute:
        return self.table.lookup(name, namespace)

    def routes(self, namespace: str | None) -> Sequence[ModelRoute]:
        return self.table.routes(namespace)

    def is_resident(self, uid: str) -> bool:
        if uid in self._stale:
            self._stale.discard(uid)
            return True
        return uid in self.resident

    def swap_state(self, uid: str) -> str:
        return self.states.get(uid, "RESIDENT" if uid in self.resident else "SWAPPED_OUT")

    async def ensure_resident(self, uid: str) -> None:
        self.swap_ins[uid] += 1
        self.states[uid] = "ALLOCATING"
        hold = self._holds.get(uid)
        if hold is not None:
            await hold.wait()
        if uid in self.failure:
            self.states[uid] = "SWAPPED_OUT"
            raise self.failure[uid]
        self.states[uid] = "RESTORING"
        if self.action is not None:
            await self.action(uid)
        self.resident.add(uid)
        self.states[uid] = "RESIDENT"
        self.completed[uid] += 1

    def record_request(self, uid: str, at_seconds: float) -> None:
        self.requests.append((uid, at_seconds))

    def request_started(self, uid: str) -> None:
        self.in_flight[uid] += 1

    def request_finished(self, uid: str) -> None:
        self.in_flight[uid] -= 1


def refuse(message: str) -> SwapInFailedError:
    return SwapInFailedError(message, retry_after_seconds=7)


@dataclass
class ServedGateway:
    url: str
    app: GatewayApp
    registry: CollectorRegistry

    @property
    def gateway(self) -> Gateway:
        return self.app.gateway

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


@contextlib.asynccontextmanager
async def served_gateway(
    directory: FakeDirectory, upstream_url: str, **settings: Any
) -> AsyncIterator[ServedGateway]:
    """The gateway app as the agent runs it (`start`, handler cancellation on), on a free
    loopback port."""
    registry = CollectorRegistry()
    gateway_settings = GatewaySettings(
        upstream_url=upstream_url, host="127.0.0.1", port=0, **settings
    )
    app = make_app(directory, gateway_settings, registry=registry)
    runner = await start(app)
    try:
        yield ServedGateway(f"http://127.0.0.1:{bound_port(runner)}", app, registry)
    finally:
        await runner.cleanup()
