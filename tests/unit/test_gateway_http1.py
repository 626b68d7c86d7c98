"""The gateway's HTTP/1.1 client to Triton (`gateway.http1`) against raw servers on
loopback: framing (length, chunked, until close, interim and bodiless answers), connection
reuse, the pool's limit, timeouts, and every malformed answer it refuses."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from modelswap_sidecar.gateway.errors import BadRequestError
from modelswap_sidecar.gateway.http1 import MAX_BUFFERED_BYTES, MAX_HEAD_BYTES, ConnectionPool
from modelswap_sidecar.gateway.upstream import forwarded_headers, model_path
from tests.support.waiting import until_on_loop

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    def __init__(self) -> None:
        self.connections = 0
        self.port = 0


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[Server]:
    """A server that runs `handler` on every connection (counted)."""
    state = Server()
    tasks: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the test ended (a cancelled handler is logged)
        finally:
            writer.close()
            tasks.discard(task)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


@contextlib.asynccontextmanager
async def pool_for(
    server: Server, *, limit: int = 4, read_timeout_seconds: float | None = 5.0
) -> AsyncIterator[ConnectionPool]:
    pool = ConnectionPool(
        "127.0.0.1",
        server.port,
        limit=limit,
        connect_timeout_seconds=5.0,
        read_timeout_seconds=read_timeout_seconds,
    )
    try:
        yield pool
    finally:
        await pool.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (Content-Length framed)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


def answering(*answers: bytes) -> Handler:
    """Answers the requests of a connection with `answers`, in turn."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            await read_request(reader)
            writer.write(answer)
            await writer.drain()
        await reader.read()  # until the client closes

    return handler


def ok(body: bytes, *extra: bytes) -> bytes:
    headers = b"".join(h + b"\r\n" for h in extra)
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), headers, body)


async def get(pool: ConnectionPool, target: str = "/x", body: bytes = b"") -> tuple[int, bytes]:
    async with await pool.request("POST", target, "", body) as answer:
        return answer.status, await answer.read()


@pytest.mark.asyncio
async def test_answers_reuse_one_connection_and_headers_read_case_blind() -> None:
    async with (
        raw_server(answering(ok(b"one", b"X-Thing: 7"), ok(b"two"))) as server,
        pool_for(server) as pool,
    ):
        async with await pool.request("POST", "/x", "", b"{}") as answer:
            assert answer.status == 200 and answer.header("x-thing") == "7"
            assert answer.header("X-THING") == "7" and await answer.read() == b"one"
        assert await get(pool) == (200, b"two")
        assert server.connections == 1 and pool.open_connections == 1


@pytest.mark.asyncio
async def test_the_request_arrives_with_host_length_headers_and_a_large_body() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(ok(b"%d" % len(seen[-1][1])))
        await reader.read()

    body = bytes(range(256)) * (10 << 12)  # 10 MiB: written past the socket's buffer
    async with (
        raw_server(echo) as server,
        pool_for(server) as pool,
        await pool.request("PUT", "/v2/a", "Content-Type: x/y\r\n", body) as answer,
    ):
        assert await answer.read() == str(len(body)).encode()
    head, received = seen[0]
    assert head.startswith(b"PUT /v2/a HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nContent-Type: x/y\r\n" in head and b"Content-Length: 10485760" in head
    assert received == body


@pytest.mark.asyncio
async def test_a_chunked_answer_arrives_whole_or_chunk_by_chunk() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: x\r\n\r\n"
    )
    async with (
        raw_server(answering(chunked, chunked, ok(b"after"))) as server,
        pool_for(server) as pool,
    ):
        assert await get(pool) == (200, b"hello world")
        async with await pool.request("GET", "/s", "", b"") as answer:
            parts = [chunk async for chunk in answer.chunks()]
        assert b"".join(parts) == b"hello world"
        assert await get(pool) == (200, b"after")  # the same connection, still in step
        assert server.connections == 1


@pytest.mark.asyncio
async def test_a_stream_is_passed_on_as_it_arrives() -> None:
    allow = asyncio.Event()

    async def paced(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n")
        await writer.drain()
        await allow.wait()
        writer.write(b"3\r\ntwo\r\n0\r\n\r\n")
        await reader.read()

    async with (
        raw_server(paced) as server,
        pool_for(server) as pool,
        await pool.request("POST", "/s", "", b"") as answer,
    ):
        stream = answer.chunks().__aiter__()
        assert await stream.__anext__() == b"one"  # before the rest was even sent
        allow.set()
        assert [chunk async for chunk in stream] == [b"two"]


@pytest.mark.asyncio
async def test_a_slow_reader_of_a_big_stream_gets_every_byte() -> None:
    size = 3 * MAX_BUFFERED_BYTES
    data = bytes(range(251)) * (size // 251)

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(data))
        await writer.drain()
        await reader.read()

    async with (
        raw_server(big) as server,
        pool_for(server) as pool,
        await pool.request("GET", "/big", "", b"") as answer,
    ):
        parts = []
        async for chunk in answer.chunks():
            parts.append(chunk)
            await asyncio.sleep(0.05)  # more than the buffer's worth arrives meanwhile
        assert b"".join(parts) == data


@pytest.mark.asyncio
async def test_interim_and_bodiless_answers() -> None:
    answers = (
        b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"real"),
        b"HTTP/1.1 204 No Content\r\n\r\n",
        ok(b"", b"Connection: keep-alive"),
    )
    async with raw_server(answering(*answers)) as server, pool_for(server) as pool:
        assert await get(pool) == (200, b"real")
        assert await get(pool) == (204, b"")
        assert await get(pool) == (200, b"")
        assert server.connections == 1


@pytest.mark.asyncio
async def test_an_answer_ended_by_closing_or_asking_to_close_is_not_reused() -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nall of ")
        await writer.drain()
        writer.write(b"it")
        writer.close()

    async with raw_server(until_close) as server, pool_for(server) as pool:
        assert await get(pool) == (200, b"all of it")
        assert await get(pool) == (200, b"all of it")
        assert server.connections == 2
    for answer in (
        ok(b"x", b"Connection: close"),
        b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
    ):
        async with raw_server(answering(answer, answer)) as server, pool_for(server) as pool:
            assert await get(pool) == (200, b"x")
            assert await get(pool) == (200, b"x")
            assert server.connections == 2


@pytest.mark.asyncio
async def test_a_kept_alive_connection_closed_unanswered_is_tried_once_on_a_new_one() -> None:
    """Triton closes a kept-alive connection as the next request goes out on it: that
    request is sent again on a new connection; a new connection closed unanswered is not."""

    async def one_answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"%d" % server.connections))
        await writer.drain()
        await read_request(reader)  # the next request on it: closed unanswered

    async with raw_server(one_answer_each) as server, pool_for(server) as pool:
        assert await get(pool) == (200, b"1")
        assert await get(pool) == (200, b"2")  # sent on 1, closed, sent again on 2
        assert server.connections == 2

    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with raw_server(hangs_up) as server, pool_for(server) as pool:
        with pytest.raises(ConnectionError):
            await get(pool)
        assert server.connections == 1


@pytest.mark.asyncio
async def test_an_answer_released_before_its_end_closes_its_connection() -> None:
    async def first_one_partly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if server.connections == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        else:
            writer.write(ok(b"fresh"))
        await writer.drain()
        await reader.read()

    async with (
        raw_server(first_one_partly) as server,
        pool_for(server) as pool,
        await pool.request("GET", "/", "", b"") as answer,
    ):
        assert answer.status == 200  # the rest of the body is never read
        assert await get(pool) == (200, b"fresh")
        assert server.connections == 2


@pytest.mark.asyncio
async def test_an_answer_sent_before_the_whole_request_does_not_reuse_its_connection() -> None:
    async def early(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # reads none of the body
        writer.write(ok(b"too large"))
        await writer.drain()
        await asyncio.sleep(30)

    async with raw_server(early) as server, pool_for(server) as pool:
        assert await get(pool, body=b"z" * (64 << 20)) == (200, b"too large")
        assert await get(pool, body=b"z" * (64 << 20)) == (200, b"too large")
        assert server.connections == 2


@pytest.mark.asyncio
async def test_the_pool_limit_queues_requests_and_a_cancelled_waiter_frees_its_place() -> None:
    release = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            await release.wait()
            writer.write(ok(b"done"))
            await writer.drain()

    async with raw_server(slow) as server, pool_for(server, limit=1) as pool:
        first = asyncio.create_task(get(pool))
        second = asyncio.create_task(get(pool))
        cancelled = asyncio.create_task(get(pool))
        await asyncio.sleep(0.1)
        assert server.connections == 1 and not second.done()
        cancelled.cancel()
        release.set()
        assert await first == (200, b"done") and await second == (200, b"done")
        assert await get(pool) == (200, b"done")
        assert server.connections == 1
        with pytest.raises(asyncio.CancelledError):
            await cancelled


@pytest.mark.asyncio
async def test_a_request_cancelled_while_awaiting_its_answer_frees_its_place() -> None:
    async def first_never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if server.connections > 1:
            writer.write(ok(b"second"))
            await writer.drain()
        await reader.read()

    async with raw_server(first_never) as server, pool_for(server, limit=1) as pool:
        waiting = asyncio.create_task(get(pool))
        await until_on_loop(lambda: server.connections == 1, "the first request sent")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await get(pool) == (200, b"second")  # on a new connection, in the one place
        assert server.connections == 2


@pytest.mark.asyncio
async def test_a_request_cancelled_while_its_body_goes_out_frees_its_place(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def reads_nothing_first(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if server.connections == 1:
            await asyncio.sleep(30)  # never reads: the client's writes back up
        await read_request(reader)
        writer.write(ok(b"second"))
        await writer.drain()
        await reader.read()

    async with raw_server(reads_nothing_first) as server, pool_for(server, limit=1) as pool:
        sending = asyncio.create_task(get(pool, body=b"z" * (64 << 20)))
        await until_on_loop(lambda: server.connections == 1, "the first request going out")
        await asyncio.sleep(0.1)
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        assert await get(pool) == (200, b"second")
    gc.collect()
    assert "never retrieved" not in caplog.text


@pytest.mark.asyncio
async def test_a_closed_pool_refuses_and_fails_its_waiters() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async with raw_server(silent) as server:
        pool = ConnectionPool(
            "127.0.0.1", server.port, limit=1, connect_timeout_seconds=5, read_timeout_seconds=None
        )
        first = asyncio.create_task(get(pool))
        waiting = asyncio.create_task(get(pool))
        await asyncio.sleep(0.1)
        await pool.close()
        for task in (first, waiting):
            with pytest.raises(ConnectionError):
                await task
        with pytest.raises(ConnectionError, match="closed"):
            await get(pool)


@pytest.mark.asyncio
async def test_silence_past_the_read_timeout_fails_the_answer() -> None:
    async def stalls_mid_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        await reader.read()

    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async with (
        raw_server(never_answers) as server,
        pool_for(server, read_timeout_seconds=0.3) as pool,
    ):
        with pytest.raises(TimeoutError, match=r"sent nothing for 0\.3 s"):
            await get(pool)
    async with (
        raw_server(stalls_mid_body) as server,
        pool_for(server, read_timeout_seconds=0.3) as pool,
        await pool.request("GET", "/", "", b"") as answer,
    ):
        with pytest.raises(TimeoutError):
            await answer.read()


@pytest.mark.asyncio
async def test_a_connection_unused_past_the_idle_expiry_is_closed() -> None:
    async with raw_server(answering(ok(b"a"), ok(b"b"))) as server:
        pool = ConnectionPool(
            "127.0.0.1",
            server.port,
            limit=4,
            connect_timeout_seconds=5,
            read_timeout_seconds=600,
            idle_seconds=0.3,
        )
        try:
            assert await get(pool) == (200, b"a")
            assert pool.open_connections == 1
            await until_on_loop(lambda: pool.open_connections == 0, "the idle connection closed")
            assert await get(pool) == (200, b"a")  # a new connection's first answer
            assert server.connections == 2
        finally:
            await pool.close()


@pytest.mark.asyncio
async def test_a_read_timeout_shorter_than_the_idle_expiry_still_holds_on_a_kept_connection() -> (
    None
):
    async def answers_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"a"))
        await writer.drain()
        await reader.read()  # the second request is never answered

    async with (
        raw_server(answers_once) as server,
        pool_for(server, read_timeout_seconds=0.3) as pool,
    ):
        assert await get(pool) == (200, b"a")
        await asyncio.sleep(0.5)  # idle: the connection's timer is now armed for 15 s
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await get(pool)  # on the kept connection
        assert time.monotonic() - started < 2


@pytest.mark.asyncio
async def test_a_connection_idle_longer_than_the_read_timeout_still_serves() -> None:
    async with (
        raw_server(answering(ok(b"a"), ok(b"b"))) as server,
        pool_for(server, read_timeout_seconds=0.2) as pool,
    ):
        assert await get(pool) == (200, b"a")
        await asyncio.sleep(0.5)
        assert await get(pool) == (200, b"b")


@pytest.mark.asyncio
async def test_a_connection_closed_before_or_during_the_answer_is_a_connection_error() -> None:
    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async def cuts_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()

    async with raw_server(hangs_up) as server, pool_for(server) as pool:
        with pytest.raises(ConnectionError, match="closed the connection"):
            await get(pool)
    async with (
        raw_server(cuts_short) as server,
        pool_for(server) as pool,
        await pool.request("GET", "/", "", b"") as answer,
    ):
        with pytest.raises(ConnectionError, match="closed the connection"):
            await answer.read()


MALFORMED = [
    (b"SPDY/3 200 OK\r\n\r\n", "not HTTP"),
    (b"HTTP/1.1 2000 OK\r\n\r\n", "not HTTP"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", "bad Content-Length"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * MAX_HEAD_BYTES, "head is too long"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-3\r\n", "negative chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 2000, "size line"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc", "does not end with CRLF"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("answer", "complaint"), MALFORMED)
async def test_a_malformed_answer_is_a_connection_error(answer: bytes, complaint: str) -> None:
    async with raw_server(answering(answer)) as server, pool_for(server) as pool:
        with pytest.raises(ConnectionError, match=complaint):
            await get(pool)
        await until_on_loop(lambda: pool.open_connections == 0, "the connection closed", 5)


@pytest.mark.asyncio
@pytest.mark.parametrize("pause_seconds", [0.0, 0.1])
async def test_bytes_nobody_asked_for_close_the_connection(pause_seconds: float) -> None:
    """More bytes than the answer's length, with it or after it: the answer stands, the
    connection is not used again."""

    async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"x"))
        if pause_seconds:
            await writer.drain()
            await asyncio.sleep(pause_seconds)
        writer.write(b"surprise")
        await reader.read()

    async with raw_server(chatty) as server, pool_for(server) as pool:
        assert await get(pool) == (200, b"x")
        await until_on_loop(lambda: pool.open_connections == 0, "the connection closed", 5)
        assert await get(pool) == (200, b"x")
        assert server.connections == 2


def test_forwarded_headers_and_model_paths() -> None:
    sent = {"Content-Type": "application/json", "Host": "h", "traceparent": "00-1"}
    lines = forwarded_headers(sent)
    assert lines == "Content-Type: application/json\r\ntraceparent: 00-1\r\n"
    with pytest.raises(BadRequestError, match="line break"):
        forwarded_headers({"Content-Type": "a\r\nX-Injected: 1"})
    assert model_path("m-1", None, "/infer") == "/v2/models/m-1/infer"
    assert model_path("m-1", "2 b/c", "/ready") == "/v2/models/m-1/versions/2%20b%2Fc/ready"
