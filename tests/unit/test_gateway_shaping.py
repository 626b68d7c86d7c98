"""Batch shaping by prompt length (issue 29, item 5): the buckets, the window, the release
order, a client that goes away, and off as a passthrough (`gateway/shaping.py`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.exchange import SHAPING_WAIT_HEADER
from modelswap_sidecar.gateway.shaping import (
    GROUP_PARAMETER,
    NOT_HELD,
    BatchShaper,
    bucket_of,
    tagged,
)
from tests.support.gateway_fakes import route
from tests.support.gateway_world import GatewayWorld, gateway_world

WINDOW_SECONDS = 0.3
#: Room for a loaded 2-core machine: the wait is the window plus this at most.
SLACK_SECONDS = 2.0
SHAPED = dataclasses.replace(
    route("chat", "team-a", decoupled=True),
    shaping_wait_seconds=WINDOW_SECONDS,
    shaping_edges_bytes=(100, 1000),
)


def test_buckets_by_edges() -> None:
    edges = (100, 1000)
    assert [bucket_of(edges, n) for n in (0, 99, 100, 999, 1000, 10**9)] == [0, 0, 1, 1, 2, 2]
    assert bucket_of((), 5) == 0


@pytest.mark.asyncio
async def test_off_returns_at_once_and_holds_nothing() -> None:
    shaper = BatchShaper()
    off = dataclasses.replace(SHAPED, shaping_wait_seconds=0.0)
    assert await shaper.hold(off, 50) == NOT_HELD
    assert shaper.waiting(off.uid) == 0 and shaper.released == {}


@pytest.mark.asyncio
async def test_a_window_releases_its_buckets_together_shorter_first() -> None:
    shaper = BatchShaper()
    order: list[int] = []
    waits: list[float] = []
    groups: dict[int, str | None] = {}

    async def one(prompt_bytes: int) -> None:
        held = await shaper.hold(SHAPED, prompt_bytes)
        waits.append(held.seconds)
        groups[prompt_bytes] = held.group
        order.append(prompt_bytes)

    loop = asyncio.get_running_loop()
    started = loop.time()
    # arrival order mixes lengths; all come within the first window
    tasks = [asyncio.create_task(one(n)) for n in (5000, 10, 500, 20, 6000, 30)]
    await asyncio.sleep(0)
    assert shaper.waiting(SHAPED.uid) == 6 and order == []
    await asyncio.gather(*tasks)
    elapsed = loop.time() - started
    # buckets due at the same moment: shorter first, each bucket in arrival order
    assert order == [10, 20, 30, 500, 5000, 6000]
    assert WINDOW_SECONDS - 0.01 <= elapsed < WINDOW_SECONDS + SLACK_SECONDS
    assert all(0.0 < w < WINDOW_SECONDS + SLACK_SECONDS for w in waits)
    assert shaper.released == {SHAPED.uid: 6} and shaper.waiting(SHAPED.uid) == 0
    # each bucket released is one group
    assert groups[10] == groups[20] == groups[30] != groups[500] != groups[5000]
    assert groups[5000] == groups[6000] and None not in groups.values()


def test_tagging_sets_the_group_parameter_of_either_body_form() -> None:
    fields = {"text_input": "a", "parameters": {"max_tokens": 2}}
    tagged_json, none = tagged(fields, None, "7")
    assert none is None and tagged_json == {
        "text_input": "a",
        "parameters": {"max_tokens": 2, GROUP_PARAMETER: "7"},
    }
    assert fields == {"text_input": "a", "parameters": {"max_tokens": 2}}  # a copy
    _, raw = tagged(None, json.dumps({"text_input": "a"}).encode(), "8")
    assert raw is not None and json.loads(raw)["parameters"] == {GROUP_PARAMETER: "8"}
    # not held, or parameters that are not an object (the model refuses them): unchanged
    assert tagged(fields, None, None) == (fields, None)
    odd = json.dumps({"text_input": "a", "parameters": [1]}).encode()
    assert tagged(None, odd, "9") == (None, odd)


@pytest.mark.asyncio
async def test_each_bucket_has_its_own_window_from_its_first_request() -> None:
    shaper = BatchShaper()
    order: list[int] = []

    async def one(prompt_bytes: int) -> None:
        await shaper.hold(SHAPED, prompt_bytes)
        order.append(prompt_bytes)

    long_one = asyncio.create_task(one(5000))
    await asyncio.sleep(WINDOW_SECONDS / 2)  # the long bucket's window is half gone
    short = [asyncio.create_task(one(n)) for n in (10, 20)]
    await asyncio.gather(long_one, *short)
    # the long bucket opened first, so it is released first, alone
    assert order == [5000, 10, 20]
    # a request after a release opens a new window
    again = asyncio.create_task(one(30))
    await asyncio.sleep(0)
    assert shaper.waiting(SHAPED.uid) == 1
    await again
    assert order[-1] == 30 and shaper.released[SHAPED.uid] == 4


@pytest.mark.asyncio
async def test_a_client_that_goes_away_leaves_its_bucket() -> None:
    shaper = BatchShaper()
    gone = asyncio.create_task(shaper.hold(SHAPED, 10))
    stays = asyncio.create_task(shaper.hold(SHAPED, 20))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert shaper.waiting(SHAPED.uid) == 1
    await stays
    assert shaper.released == {SHAPED.uid: 1}
    # the last waiter of a bucket gone: the bucket closes, its timer with it
    alone = asyncio.create_task(shaper.hold(SHAPED, 10))
    await asyncio.sleep(0)
    alone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await alone
    assert shaper.waiting(SHAPED.uid) == 0 and shaper._open == {}


@pytest.mark.asyncio
async def test_close_releases_everyone() -> None:
    shaper = BatchShaper()
    waiting = [asyncio.create_task(shaper.hold(SHAPED, n)) for n in (10, 5000)]
    await asyncio.sleep(0)
    shaper.close()
    waits = await asyncio.wait_for(asyncio.gather(*waiting), timeout=WINDOW_SECONDS / 2)
    assert len(waits) == 2 and shaper.waiting(SHAPED.uid) == 0


# Through the served gateway in front of the fake Triton, whose `generate_bodies` lists the
# requests in the order they reached it.

LONG, SHORT = "w " * 600, "s s "  # 1,200 and 4 bytes


@dataclasses.dataclass
class World(GatewayWorld):
    shaping_waits: list[str | None] = dataclasses.field(default_factory=list)

    async def generate(self, prompt: str, session: str | None = None) -> str:
        body: dict[str, Any] = {"text_input": prompt, "parameters": {"max_tokens": 2}}
        if session is not None:
            body["parameters"]["session_id"] = session
        path = "/ns/team-a/v2/models/chat/generate_stream"
        async with self.http.post(self.served.url + path, json=body) as r:
            assert r.status == 200, await r.text()
            self.shaping_waits.append(r.headers.get(SHAPING_WAIT_HEADER))
            return "".join(event["text_output"] for event in data_lines(await r.read()))


def data_lines(raw: bytes) -> list[Any]:
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith(b"data: {")]


def world(chat: ModelRoute) -> AbstractAsyncContextManager[World]:
    return gateway_world(World, [chat], resident=True)


@pytest.mark.asyncio
async def test_off_the_gateway_never_holds_and_requests_reach_triton_as_sent() -> None:
    off = dataclasses.replace(SHAPED, shaping_wait_seconds=0.0)
    async with world(off) as w:
        calls: list[int] = []

        async def counted(route: ModelRoute, prompt_bytes: int) -> float:
            calls.append(prompt_bytes)
            return 0.0

        w.served.gateway.shaper.hold = counted  # type: ignore[method-assign]
        prompts = [LONG, SHORT, LONG, SHORT]
        for prompt in prompts:  # one after another: the order they reach Triton is fixed
            assert await w.generate(prompt) == (" " + prompt.split()[0].upper()) * 2
        assert calls == []
        assert [b["text_input"] for b in w.triton.generate_bodies] == prompts
        assert w.shaping_waits == [None] * len(prompts)
        assert all(GROUP_PARAMETER not in b["parameters"] for b in w.triton.generate_bodies)


@pytest.mark.asyncio
async def test_on_a_window_reaches_triton_in_runs_of_one_bucket() -> None:
    async with world(SHAPED) as w:
        loop = asyncio.get_running_loop()
        started = loop.time()
        prompts = [LONG, SHORT, LONG, SHORT, LONG, SHORT]
        answers = await asyncio.gather(*(w.generate(p) for p in prompts))
        elapsed = loop.time() - started
        assert answers == [(" " + p.split()[0].upper()) * 2 for p in prompts]
        reached = [b["text_input"] for b in w.triton.generate_bodies]
        assert reached == [SHORT] * 3 + [LONG] * 3
        groups = [b["parameters"][GROUP_PARAMETER] for b in w.triton.generate_bodies]
        assert len(set(groups[:3])) == len(set(groups[3:])) == 1 and groups[0] != groups[3]
        assert WINDOW_SECONDS - 0.01 <= elapsed < WINDOW_SECONDS + SLACK_SECONDS
        assert w.served.gateway.shaper.released == {SHAPED.uid: 6}
        waits = [float(seconds or "nan") for seconds in w.shaping_waits]
        assert all(0 < wait < WINDOW_SECONDS + SLACK_SECONDS for wait in waits), waits
        # a conversation runs alone at the model: never held
        held_before = dict(w.served.gateway.shaper.released)
        assert await w.generate(SHORT, session="conv-1") == " S S"
        assert w.served.gateway.shaper.released == held_before
        assert w.shaping_waits[-1] is None
        assert GROUP_PARAMETER not in w.triton.generate_bodies[-1]["parameters"]
