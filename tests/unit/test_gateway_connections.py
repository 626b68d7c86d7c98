"""The gateway's connection caps (issue 26, item 2): the caps derived from the open-files
limit, and over HTTP on loopback with small caps: idle connections closed longest-idle
first to admit new ones, a connection refused 503 `TooManyConnections` while every other
is busy, the cap per client address (127.0.0.x are all loopback), the metrics and one log
line per burst. The real agent under a flood is tests/integration/
test_reliability_connections.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from modelswap_sidecar.gateway import connections
from modelswap_sidecar.gateway.connections import (
    CapsError,
    ConnectionCaps,
    control_caps,
    default_reserve_fds,
    metrics_caps,
    plan_caps,
)
from tests.support.gateway_fakes import FakeDirectory, ServedGateway, route, served_gateway
from tests.support.waiting import until_on_loop

BERT = route("bert", "team-a")
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
).encode()

# -- the caps (pure) -------------------------------------------------------------------------


def test_default_caps_leave_the_reserve_and_what_is_open() -> None:
    caps = plan_caps(
        limit=4096,
        open_now=100,
        max_connections=None,
        max_connections_per_address=None,
        reserve_file_descriptors=None,
    )
    assert default_reserve_fds(4096) == 1024
    assert caps == ConnectionCaps(
        max_connections=4096 - 100 - 1024, max_connections_per_address=743
    )
    # a low limit keeps half for the gateway; a high one a quarter in reserve
    assert default_reserve_fds(1024) == 512
    assert default_reserve_fds(1 << 20) == 1 << 18


def test_configured_caps_are_kept_when_they_fit() -> None:
    caps = plan_caps(
        limit=4096,
        open_now=50,
        max_connections=1000,
        max_connections_per_address=10,
        reserve_file_descriptors=2000,
    )
    assert caps == ConnectionCaps(max_connections=1000, max_connections_per_address=10)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"max_connections": 4000}, "gateway.maxConnections: 4000 connections"),
        ({"reserve_file_descriptors": 4096}, "gateway.reserveFileDescriptors"),
        ({"max_connections_per_address": 5000}, "gateway.maxConnectionsPerAddress: 5000"),
    ],
)
def test_caps_that_cannot_fit_the_limit_name_their_field(given: dict[str, int], field: str) -> None:
    kwargs: dict[str, Any] = {
        "max_connections": None,
        "max_connections_per_address": None,
        "reserve_file_descriptors": None,
        **given,
    }
    with pytest.raises(CapsError, match=field):
        plan_caps(limit=4096, open_now=10, **kwargs)


def test_the_control_api_and_metrics_caps_fit_in_the_reserve() -> None:
    for limit in (256, 1024, 4096, 1 << 20):
        taken = control_caps(limit).max_connections + metrics_caps(limit).max_connections
        assert taken <= default_reserve_fds(limit) // 2, limit
    assert control_caps(1 << 20).max_connections == 256


# -- over HTTP ------------------------------------------------------------------------------


class Conn:
    """A raw client connection (so that a test decides when it speaks)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        head = f"{method} {path} HTTP/1.1\r\nHost: gw\r\nContent-Length: {len(body)}\r\n\r\n"
        self.writer.write(head.encode() + body)
        return await self.answer()

    def send(self, method: str, path: str, body: bytes = b"") -> None:
        head = f"{method} {path} HTTP/1.1\r\nHost: gw\r\nContent-Length: {len(body)}\r\n\r\n"
        self.writer.write(head.encode() + body)

    async def answer(self) -> tuple[int, bytes]:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
        body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return int(lines[0].split()[1]), head + body

    async def closed(self) -> bool:
        """True once the server closed the connection (EOF or reset)."""
        try:
            return await asyncio.wait_for(self.reader.read(1), 10) == b""
        except ConnectionResetError:
            return True

    def is_closed(self) -> bool:
        return self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class Client:
    def __init__(self, served: ServedGateway, directory: FakeDirectory) -> None:
        self.served = served
        self.directory = directory
        self.port = int(served.url.rsplit(":", 1)[1])
        self.conns: list[Conn] = []

    async def open(self, address: str = "127.0.0.1") -> Conn:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.port, local_addr=(address, 0)
        )
        conn = Conn(reader, writer)
        self.conns.append(conn)
        return conn

    async def open_idle(self, n: int, address: str = "127.0.0.1") -> list[Conn]:
        """`n` connections the gateway holds, each waiting for its first request."""
        limiter = self.served.app.limiter
        assert limiter is not None
        before = limiter.open_connections
        opened = [await self.open(address) for _ in range(n)]
        await until_on_loop(lambda: limiter.open_connections == before + n, f"{n} accepted")
        await asyncio.sleep(0)  # their handlers start waiting for a request
        return opened

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


@contextlib.asynccontextmanager
async def gateway(**settings: Any) -> AsyncIterator[tuple[ServedGateway, Client]]:
    directory = FakeDirectory([BERT], resident=())
    async with served_gateway(directory, "http://127.0.0.1:1", **settings) as served:
        client = Client(served, directory)
        try:
            yield served, client
        finally:
            client.close()
            with contextlib.suppress(KeyError):
                directory.release(BERT.uid)


def counted(served: ServedGateway, name: str, limit: str) -> float:
    return served.metric(name, limit=limit)


@pytest.mark.asyncio
async def test_at_the_cap_the_longest_idle_connection_makes_room() -> None:
    async with gateway(max_connections=8, max_connections_per_address=8) as (served, client):
        idle = await client.open_idle(4, "127.0.0.2") + await client.open_idle(4, "127.0.0.3")
        # the newest idle ones were used since: the first one stays the longest idle
        for conn in idle[1:]:
            assert (await conn.request("GET", "/v2/health/live"))[0] == 200
        probe = await client.open()
        assert (await probe.request("GET", "/v2/health/live"))[0] == 200
        assert await idle[0].closed()
        assert not any(c.is_closed() for c in idle[1:])
        assert (
            counted(served, "modelswap_gateway_connections_closed_idle_total", "max_connections")
            == 1
        )
        assert served.metric("modelswap_gateway_open_connections") == 8
        assert served.metric("modelswap_gateway_max_connections", limit="max_connections") == 8


@pytest.mark.asyncio
async def test_a_flood_of_idle_connections_never_keeps_a_probe_out() -> None:
    async with gateway(max_connections=16, max_connections_per_address=8) as (served, client):
        for i in range(4):
            await client.open_idle(4, f"127.0.0.{2 + i}")
        for i in range(40):  # a flood: each new one takes an idle one's place
            await client.open(f"127.0.0.{2 + i % 4}")
        limiter = served.app.limiter
        assert limiter is not None
        await until_on_loop(lambda: limiter.closed_idle["max_connections"] >= 40, "40 closed")
        probe = await client.open()
        assert (await probe.request("GET", "/v2/health/live"))[0] == 200
        assert limiter.open_connections <= 16
        assert limiter.refused == {"max_connections": 0, "max_connections_per_address": 0}


@pytest.mark.asyncio
async def test_with_every_connection_busy_a_new_one_is_answered_503_and_closed() -> None:
    async with gateway(max_connections=4, max_connections_per_address=4) as (served, client):
        client.directory.hold(BERT.uid)
        busy = await client.open_idle(2, "127.0.0.2") + await client.open_idle(2, "127.0.0.3")
        for conn in busy:  # each waits for the held swap-in: in flight
            conn.send("POST", "/ns/team-a/v2/models/bert/infer", INFER)
        queues = served.gateway.queues
        await until_on_loop(lambda: queues.depth(BERT.uid) == 4, "4 requests queued")

        refused = await client.open()
        status, answer = await refused.request("GET", "/v2/health/live")
        assert status == 503
        assert b"Retry-After: 1" in answer and b'"reason": "TooManyConnections"' in answer
        assert await refused.closed()
        assert (
            counted(served, "modelswap_gateway_connections_refused_total", "max_connections") == 1
        )
        assert (
            served.metric(
                "modelswap_gateway_requests_total", uid="", namespace="", model="", code="503"
            )
            == 1
        )

        # the busy ones were untouched and answer once the swap-in completes; then the
        # refused client's retry is admitted (idle ones make room again)
        client.directory.release(BERT.uid)
        answers = [(await conn.answer())[1] for conn in busy]
        assert not any(b"TooManyConnections" in a for a in answers), answers
        retry = await client.open()
        assert (await retry.request("GET", "/v2/health/live"))[0] == 200


@pytest.mark.asyncio
async def test_a_refused_connection_that_never_speaks_is_closed_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connections, "REFUSAL_GRACE_SECONDS", 0.2)
    async with gateway(max_connections=2, max_connections_per_address=2) as (served, client):
        client.directory.hold(BERT.uid)
        busy = await client.open_idle(2)
        for conn in busy:
            conn.send("POST", "/ns/team-a/v2/models/bert/infer", INFER)
        await until_on_loop(lambda: served.gateway.queues.depth(BERT.uid) == 2, "queued")
        silent = await client.open()
        assert await silent.closed()
        limiter = served.app.limiter
        assert limiter is not None
        await until_on_loop(lambda: not limiter.refusing, "the refused connection forgotten")


@pytest.mark.asyncio
async def test_one_address_is_held_to_its_own_cap() -> None:
    async with gateway(max_connections=32, max_connections_per_address=4) as (served, client):
        others = await client.open_idle(4, "127.0.0.3")
        flood = await client.open_idle(4, "127.0.0.2")
        for _ in range(10):  # the same address again: its own longest-idle ones go
            flood.append(await client.open("127.0.0.2"))
        limiter = served.app.limiter
        assert limiter is not None
        per_address = "max_connections_per_address"
        await until_on_loop(lambda: limiter.closed_idle[per_address] == 10, "10 closed")
        assert limiter.closed_idle["max_connections"] == 0
        # the other address's idle connections were not touched, and still serve
        assert (await others[0].request("GET", "/v2/health/live"))[0] == 200
        assert not any(c.is_closed() for c in others)
        assert all([await c.closed() for c in flood[:10]])

        # the flooding address with every connection busy is refused; another is not
        client.directory.hold(BERT.uid)
        for conn in flood[10:]:
            conn.send("POST", "/ns/team-a/v2/models/bert/infer", INFER)
        await until_on_loop(lambda: served.gateway.queues.depth(BERT.uid) == 4, "queued")
        one_more = await client.open("127.0.0.2")
        assert (await one_more.request("GET", "/v2/health/live"))[0] == 503
        assert counted(served, "modelswap_gateway_connections_refused_total", per_address) == 1
        elsewhere = await client.open("127.0.0.4")
        assert (await elsewhere.request("GET", "/v2/health/live"))[0] == 200


@pytest.mark.asyncio
async def test_a_burst_is_logged_once_when_it_starts_and_once_when_it_is_over(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(connections, "QUIET_SECONDS", 1.0)
    caplog.set_level(logging.WARNING, logger=connections.__name__)
    async with gateway(max_connections=4, max_connections_per_address=4) as (served, client):
        await client.open_idle(2, "127.0.0.2")
        await client.open_idle(2, "127.0.0.3")
        for _ in range(20):
            await client.open()
        limiter = served.app.limiter
        assert limiter is not None
        await until_on_loop(lambda: sum(limiter.closed_idle.values()) == 20, "20 closed")
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1, lines
        assert "at its cap of 4 connections in all (gateway.maxConnections)" in lines[0]
        await until_on_loop(lambda: len(caplog.records) == 2, "the burst's end", 5)
        assert "20 idle connections closed and 0 refused" in caplog.records[1].getMessage()
