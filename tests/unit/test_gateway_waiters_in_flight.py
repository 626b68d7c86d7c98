"""Requests queued at the gateway for a model's swap-in count as in flight (issue 26,
item 7): the policy reads the count, so a model that just swapped in with waiters not yet
at Triton is never an idle victim (before, the count started only once a waiter was
released, and another swap-in could take the model in between). Over HTTP on loopback,
with a fake Triton and the swap-in held until the test releases it."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from tests.support.gateway_fakes import route
from tests.support.gateway_world import GatewayWorld, gateway_world
from tests.support.waiting import until_on_loop

BERT = route("bert", "team-a")
SLOW = route("slow", "team-a", queue_timeout_seconds=0.2)
INFER = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}


class World(GatewayWorld):
    async def post(self, name: str) -> int:
        url = f"{self.served.url}/ns/team-a/v2/models/{name}/infer"
        async with self.http.post(url, json=INFER) as r:
            await r.read()
            return r.status


def world(**settings: Any) -> AbstractAsyncContextManager[World]:
    return gateway_world(World, (BERT, SLOW), resident=False, **settings)


@pytest.mark.asyncio
async def test_requests_waiting_for_a_swap_in_count_as_in_flight() -> None:
    async with world() as w:
        w.directory.hold(BERT.uid)
        posts = [asyncio.create_task(w.post("bert")) for _ in range(3)]
        queues = w.served.gateway.queues
        await until_on_loop(lambda: queues.depth(BERT.uid) == 3, "3 requests queued")
        assert w.directory.in_flight[BERT.uid] == 3

        w.directory.release(BERT.uid)
        assert await asyncio.wait_for(asyncio.gather(*posts), 10) == [200] * 3
        await until_on_loop(lambda: w.directory.in_flight[BERT.uid] == 0, "answered")


@pytest.mark.asyncio
async def test_a_waiter_that_times_out_is_no_longer_in_flight() -> None:
    async with world() as w:
        w.directory.hold(SLOW.uid)
        post = asyncio.create_task(w.post("slow"))
        await until_on_loop(lambda: w.directory.in_flight[SLOW.uid] == 1, "1 queued")
        assert await asyncio.wait_for(post, 10) == 503  # QueueTimeout
        assert w.directory.in_flight[SLOW.uid] == 0
        w.directory.release(SLOW.uid)
