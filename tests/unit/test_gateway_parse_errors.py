"""Requests the gateway cannot parse are the client's errors: a 400, one WARNING line and
then a count every few seconds, never an ERROR with a traceback per request (anyone who can
connect could fill the agent's log). Over a served gateway with raw bytes, and the
adapter's own rules on an injected clock."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine

from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.parse_errors import HTTP2_HINT, ParseErrorLog
from tests.support.gateway_world import GatewayWorld, gateway_world

ROUTE = ModelRoute(uid="u1", namespace="team-a", name="llama", triton_name="m-u1")
GARBAGE = (
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # HTTP/2's preface: a gRPC client on this port
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Name: y\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # a TLS ClientHello
    b"GET /v2 HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
)


async def send(port: str, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(200), 5)
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_unparsable_requests_are_400s_logged_in_one_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with gateway_world(GatewayWorld, [ROUTE], resident=True) as w:
        port = w.served.url.split(":")[-1]
        with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
            answers = [await send(port, data) for data in GARBAGE * 5]
        # the gateway still answers a good request afterwards
        async with w.http.get(f"{w.served.url}/v2/health/ready") as ok:
            assert ok.status == 200
    assert all(b" 400 " in a.split(b"\r\n")[0] or a == b"" for a in answers), answers
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert records, "nothing logged"
    assert all(r.exc_info is None and r.levelno <= logging.WARNING for r in records), [
        (r.levelname, r.getMessage()) for r in records
    ]
    # one WARNING, then quiet for 10 s (TLS bytes stay at DEBUG, as aiohttp has them)
    warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "could not parse" in warnings[0]
    assert HTTP2_HINT in warnings[0]  # the first was HTTP/2's preface


def test_a_burst_is_counted_in_one_line_per_interval_and_other_errors_pass_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    log = ParseErrorLog(
        logging.getLogger("parse-errors-test"), summary_seconds=10, clock=lambda: now[0]
    )
    with caplog.at_level(logging.DEBUG, logger="parse-errors-test"):
        for _ in range(5):
            log.exception("Error handling request from %s", "10.0.0.9", exc_info=BadStatusLine("x"))
        now[0] += 11
        log.exception("Error handling request from %s", "10.0.0.7",
                      exc_info=BadHttpMessage("Duplicate Content-Length"))  # fmt: skip
        try:
            raise RuntimeError("a bug of ours")
        except RuntimeError as e:
            log.exception("Unhandled exception", exc_info=e)
    messages = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert messages[0][:2] == (
        "WARNING",
        "refused a request it could not parse from 10.0.0.9: Bad status line 'x'",
    )
    assert messages[1][0] == "WARNING" and messages[1][1].startswith(
        "refused 5 requests it could not parse in the last 11 s; the last from 10.0.0.7"
    )
    assert "Duplicate Content-Length" in messages[1][1]
    assert messages[2] == ("ERROR", "Unhandled exception", True)  # ours: kept whole
    assert log.refused == 6
