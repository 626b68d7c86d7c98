"""The world the gateway's HTTP tests run in: a served gateway (`served_gateway`) in front
of a fake Triton (`fake_triton`), routing a directory of models; a swap-in marks the model
loaded on the fake Triton. Each test module subclasses `GatewayWorld` with its helpers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from modelswap_sidecar.gateway.directory import ModelRoute
from tests.support.gateway_fakes import FakeDirectory, ServedGateway, served_gateway
from tests.support.gateway_upstream import FakeTriton, fake_triton


@dataclass
class GatewayWorld:
    triton: FakeTriton
    directory: FakeDirectory
    served: ServedGateway
    http: aiohttp.ClientSession


W = TypeVar("W", bound=GatewayWorld)


@contextlib.asynccontextmanager
async def gateway_world(
    world: type[W],
    routes: Sequence[ModelRoute],
    *,
    resident: bool,
    triton: Any = None,
    **settings: Any,
) -> AsyncIterator[W]:
    """`routes` resident (and loaded on the fake Triton) unless `resident` is False;
    `triton`: another fake Triton to serve (see `fake_triton`); `settings` go to
    `GatewaySettings`."""
    async with fake_triton(triton) as served_triton:
        directory = FakeDirectory(routes, resident=[r.uid for r in routes] if resident else ())
        served_triton.loaded = {r.triton_name for r in routes} if resident else set()

        async def load(uid: str) -> None:
            loaded = directory.table.by_uid(uid)
            assert loaded is not None
            served_triton.loaded.add(loaded.triton_name)

        directory.action = load
        async with (
            served_gateway(directory, served_triton.url, **settings) as served,
            aiohttp.ClientSession() as http,
        ):
            yield world(served_triton, directory, served, http)
