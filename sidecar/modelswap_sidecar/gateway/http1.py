"""A small HTTP/1.1 client for the gateway's one upstream, Triton: a pool of keep-alive
connections to one host and port, and answers read whole or chunk by chunk.

    pool = ConnectionPool("127.0.0.1", 8000, limit=256, connect_timeout_seconds=10,
                          read_timeout_seconds=600)
    async with await pool.request("POST", "/v2/models/m-1/infer", headers, body) as answer:
        answer.status, answer.header("Content-Type"), await answer.read()
    await pool.close()

Why not aiohttp's client: its per-request machinery (request and response objects, URL
objects, timers, traces, cookie jar) cost about 380 us of CPU per request on the 2-core
bench machine, as much again as the gateway's own server; this client is a protocol
object and a parser over bytes. It does what Triton's HTTP server needs and no more:
plain HTTP (no TLS, no proxies, no redirects, no decompression: the gateway sends
`Accept-Encoding: identity`), bodies framed by Content-Length, chunked encoding or the
connection's end, interim 1xx answers skipped.

Failures raise OSError (`ConnectionError` when the connection closed or the answer is
not HTTP, from `connect` when Triton does not listen) or TimeoutError (no connection within
the connect timeout, or a silence of the read timeout while an answer is awaited); the
caller (`upstream`) turns them into its error. A connection is reused only after an
answer was read to its end and Triton did not ask to close; an answer released early
closes its connection, and one unused for `IDLE_SECONDS` is closed. A request sent on a
kept-alive connection that Triton closes before a byte of its answer arrives (Triton
closed it while idle, as the request went out) is sent once more on a new connection.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from types import TracebackType
from typing import cast

#: Longest status line and headers of an answer.
MAX_HEAD_BYTES = 64 << 10
#: Body bytes buffered for a reader that has not taken them before reading pauses.
MAX_BUFFERED_BYTES = 4 << 20
#: A kept-alive connection unused this long is closed (aiohttp's client waits as long), so
#: the connections a burst opened do not stay open for ever.
IDLE_SECONDS = 15.0

_HEAD_END = b"\r\n\r\n"
_NO_BODY_STATUSES = (204, 304)

# parser states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _IDLE = range(8)


class Answer:
    """Triton's answer: status, headers (names lower-cased) and a body that arrives later.
    Release it (`async with`, or `release()`) once done with it."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.keep_alive = True
        self._parts: list[bytes] = []
        self._buffered_bytes = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._streaming = False
        self._released = False

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    async def read(self) -> bytes:
        """The whole body."""
        while not self._done:
            await self._wait()
        if self._error is not None:
            raise self._error
        parts, self._parts = self._parts, []
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive."""
        self._streaming = True
        while True:
            if self._parts:
                parts, self._parts = self._parts, []
                self._buffered_bytes = 0
                self._connection.resume()
                yield parts[0] if len(parts) == 1 else b"".join(parts)
                continue
            if self._done:
                if self._error is not None:
                    raise self._error
                return
            await self._wait()

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool when the answer was
        read to its end, else it is closed."""
        if not self._released:
            self._released = True
            self._connection.released(self._done and self._error is None and self.keep_alive)

    async def __aenter__(self) -> Answer:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    async def _wait(self) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- fed by the connection
    def _feed(self, data: bytes) -> None:
        self._parts.append(data)
        self._buffered_bytes += len(data)
        if self._streaming:
            self._wake()
            if self._buffered_bytes > MAX_BUFFERED_BYTES:
                self._connection.pause()

    def _finish(self, error: BaseException | None = None) -> None:
        if not self._done:
            self._done = True
            self._error = error
            self._wake()


class _Connection(asyncio.Protocol):
    """One connection and the answer it is receiving (one request at a time)."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._state = _IDLE
        self._remaining = 0
        self._answer: Answer | None = None
        self._head: asyncio.Future[Answer] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_data_seconds = 0.0
        self._paused_reading = False
        self._paused_writing = False
        self._drained: asyncio.Future[None] | None = None
        self.closed = False
        #: taken from the pool's idle connections, not opened for this request
        self.reused = False
        #: a byte of the answer to the current request came
        self.heard = False

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but have its methods)
        self._transport = cast(asyncio.Transport, transport)
        self._last_data_seconds = time.monotonic()
        self._arm(self._first_check_seconds())

    def data_received(self, data: bytes) -> None:
        self._last_data_seconds = time.monotonic()
        self.heard = True
        if self._state == _IDLE:
            self._fail(ConnectionError("Triton sent bytes no request asked for"))
            return
        if self._state == _LENGTH and not self._buffer and len(data) <= self._remaining:
            self._body(data)  # the common case, without copying into the buffer
        else:
            self._buffer += data
        try:
            self._parse()
        except ConnectionError as e:
            self._fail(e)

    def eof_received(self) -> bool:
        return False  # close the transport; `connection_lost` ends the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        self._pool.forget(self)
        if self._state == _UNTIL_CLOSE and exc is None and self._answer is not None:
            self._complete()
        elif self._state != _IDLE:
            why = f": {exc}" if exc else ""
            self._fail(ConnectionError(f"Triton closed the connection{why}"))
        self._wake_sender()

    def pause_writing(self) -> None:
        self._paused_writing = True

    def resume_writing(self) -> None:
        self._paused_writing = False
        self._wake_sender()

    def _wake_sender(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- used by the pool and the answer
    async def send(self, head: bytes, body: bytes) -> Answer:
        """Send one request; return its answer once its head is in."""
        assert self._transport is not None and self._state == _IDLE
        loop = asyncio.get_running_loop()
        answer = self._answer = Answer(self)
        self._state = _HEAD
        self.heard = False
        head_future = self._head = loop.create_future()
        self._last_data_seconds = time.monotonic()
        if self._pool.read_timeout_seconds is not None:
            self._check_by(self._pool.read_timeout_seconds)
        if len(body) <= 1 << 16:
            self._transport.write(head + body)
        else:  # no copy of a large body
            self._transport.write(head)
            self._transport.write(body)
        try:
            if self._paused_writing and not self.closed:
                self._drained = loop.create_future()
                await self._drained
            await head_future
        except BaseException:
            head_future.cancel()  # a failure that comes later is nobody's to retrieve
            raise
        return answer

    def released(self, reusable: bool) -> None:
        # not reused while part of the request is unsent (Triton answered before reading it)
        unsent = self._transport is None or self._transport.get_write_buffer_size() > 0
        self._pool.put_back(
            self, reusable and self._state == _IDLE and not self.closed and not unsent
        )

    def pause(self) -> None:
        if not self._paused_reading and self._transport is not None:
            self._paused_reading = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused_reading and self._transport is not None:
            self._paused_reading = False
            self._last_data_seconds = time.monotonic()
            self._transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    # -- the read timeout (a silence of that long while an answer is awaited) and the idle
    # expiry (a connection unused that long is closed). One timer per connection, for its
    # life: it fires at the latest when either may have passed since the last byte (or
    # request), and re-arms itself for the rest; no timer per request.
    def _arm(self, delay_seconds: float) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(delay_seconds, 0.0), self._check_silence)

    def _first_check_seconds(self) -> float:
        timeout = self._pool.read_timeout_seconds
        idle = self._pool.idle_seconds
        return idle if timeout is None else min(timeout, idle)

    def _check_silence(self) -> None:
        self._timer = None
        if self.closed:
            return
        silent = time.monotonic() - self._last_data_seconds
        if self._state == _IDLE:
            limit = self._pool.idle_seconds
            if silent >= limit:
                self.close()  # `connection_lost` takes it out of the pool
                return
        else:
            timeout = self._pool.read_timeout_seconds
            limit = self._pool.idle_seconds if timeout is None else timeout
            if silent >= limit and timeout is not None and not self._paused_reading:
                self._fail(TimeoutError(f"Triton sent nothing for {timeout:g} s"))
                return
        self._arm(limit - silent if silent < limit else limit)

    def _check_by(self, delay_seconds: float) -> None:
        """The timer fires within `delay_seconds` from now (a request starts: its read
        timeout may be shorter than the idle expiry the timer was armed for)."""
        loop = asyncio.get_running_loop()
        if self._timer is None or self._timer.when() > loop.time() + delay_seconds:
            if self._timer is not None:
                self._timer.cancel()
            self._arm(delay_seconds)

    # -- parsing
    def _parse(self) -> None:
        buffer = self._buffer
        while buffer:
            state = self._state
            if state == _HEAD:
                end = buffer.find(_HEAD_END)
                if end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        raise ConnectionError("Triton's answer head is too long")
                    return
                head = bytes(buffer[:end])
                del buffer[: end + 4]
                self._start_answer(head)
            elif state in (_LENGTH, _CHUNK_DATA):
                data = bytes(buffer[: self._remaining])
                del buffer[: len(data)]
                self._body(data)
            elif state == _CHUNK_SIZE:
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > 1024:
                        raise ConnectionError("Triton's chunk size line is too long")
                    return
                line = bytes(buffer[:end]).split(b";", 1)[0].strip()
                del buffer[: end + 2]
                try:
                    size = int(line, 16)
                except ValueError as e:
                    raise ConnectionError(f"Triton sent a bad chunk size {line[:20]!r}") from e
                if size < 0:
                    raise ConnectionError("Triton sent a negative chunk size")
                self._state, self._remaining = (_CHUNK_DATA, size) if size else (_TRAILER, 0)
            elif state == _CHUNK_END:
                if len(buffer) < 2:
                    return
                if buffer[:2] != b"\r\n":
                    raise ConnectionError("Triton's chunk does not end with CRLF")
                del buffer[:2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILER:
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                del buffer[: end + 2]
                if end == 0:
                    self._complete()
            elif state == _UNTIL_CLOSE:
                data = bytes(buffer)
                buffer.clear()
                self._body(data)
            else:  # _IDLE with bytes left: Triton sent more than it was asked for
                raise ConnectionError("Triton sent bytes no request asked for")

    def _start_answer(self, head: bytes) -> None:
        answer = self._answer
        assert answer is not None
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if (
            not version.startswith("HTTP/1.")
            or not (code.isascii() and code.isdigit())
            or len(code) != 3
        ):
            raise ConnectionError(f"Triton's answer is not HTTP/1.x: {lines[0][:60]!r}")
        status = int(code)
        if 100 <= status < 200:
            return  # an interim answer (100 Continue): the real one follows
        headers = answer.headers
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise ConnectionError(f"Triton sent a bad header line {line[:60]!r}")
            headers[name.strip().lower()] = value.strip()
        answer.status, answer.reason = status, reason
        connection = headers.get("connection", "").lower()
        answer.keep_alive = (
            "keep-alive" in connection if version == "HTTP/1.0" else "close" not in connection
        )
        length = headers.get("content-length")
        if status in _NO_BODY_STATUSES:
            self._state = _IDLE
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _CHUNK_SIZE
        elif length is not None:
            if not (length.isascii() and length.isdigit()):
                raise ConnectionError(f"Triton sent a bad Content-Length {length[:20]!r}")
            self._state, self._remaining = _LENGTH, int(length)
        else:
            self._state, answer.keep_alive = _UNTIL_CLOSE, False
        if self._head is not None and not self._head.done():
            self._head.set_result(answer)
        if self._state == _IDLE or (self._state == _LENGTH and not self._remaining):
            self._complete()

    def _body(self, data: bytes) -> None:
        answer = self._answer
        assert answer is not None
        if self._state != _UNTIL_CLOSE:
            self._remaining -= len(data)
        if data:
            answer._feed(data)
        if self._state == _LENGTH and not self._remaining:
            self._complete()
        elif self._state == _CHUNK_DATA and not self._remaining:
            self._state = _CHUNK_END

    def _complete(self) -> None:
        self._state = _IDLE
        answer, self._answer = self._answer, None
        if answer is not None:
            answer._finish()
        self._wake_sender()  # a sender still waiting to write the rest goes on to the answer

    def _fail(self, error: BaseException) -> None:
        self._state = _IDLE
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        answer, self._answer = self._answer, None
        if answer is not None:
            answer._finish(error)
        self.close()
        self._wake_sender()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class ConnectionPool:
    """Connections to one upstream; at most `limit` in use at once (more requests wait)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        limit: int,
        connect_timeout_seconds: float | None,
        read_timeout_seconds: float | None,
        idle_seconds: float = IDLE_SECONDS,
    ) -> None:
        self.host = host
        self.port = port
        self.limit = limit
        self.connect_timeout_seconds = connect_timeout_seconds
        self.read_timeout_seconds = read_timeout_seconds
        self.idle_seconds = idle_seconds
        self._host_header = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    @property
    def open_connections(self) -> int:
        return len(self._all)

    async def request(self, method: str, target: str, headers: str, body: bytes) -> Answer:
        """Send `method target` with `headers` (complete `Name: value\\r\\n` lines, Host and
        Content-Length added here) and `body`; the answer once its head is in."""
        if self._closed:
            raise ConnectionError("the connection pool is closed")
        head = (
            f"{method} {target} HTTP/1.1\r\nHost: {self._host_header}\r\n"
            f"Content-Length: {len(body)}\r\n{headers}\r\n"
        ).encode("latin-1")
        for attempt in (1, 2):
            connection = await self._acquire(fresh=attempt == 2)
            try:
                return await connection.send(head, body)
            except ConnectionError:
                self.put_back(connection, False)
                # a kept-alive connection Triton closed, unheard, as the request went out
                # (it closed it while idle): once more, on a new connection
                if attempt == 1 and connection.reused and not connection.heard:
                    continue
                raise
            except BaseException:
                self.put_back(connection, False)
                raise
        raise AssertionError("unreachable")

    async def close(self) -> None:
        self._closed = True
        for connection in list(self._all):
            connection.close()
        self._idle.clear()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionError("the connection pool is closed"))
        self._waiters.clear()
        await asyncio.sleep(0)  # let the transports finish closing

    # -- slots and connections
    async def _acquire(self, *, fresh: bool = False) -> _Connection:
        if self._in_use >= self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter  # the slot of a released connection is handed over
            except BaseException:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._free_slot()
                elif not waiter.done():
                    self._waiters.remove(waiter)
                raise
        else:
            self._in_use += 1
        try:
            while self._idle and not fresh:
                connection = self._idle.pop()
                if not connection.closed:
                    connection.reused = True
                    return connection
            return await self._connect()
        except BaseException:
            self._free_slot()
            raise

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_seconds):
            _, protocol = await loop.create_connection(
                lambda: _Connection(self), self.host, self.port
            )
        self._all.add(protocol)
        return protocol

    def put_back(self, connection: _Connection, reusable: bool) -> None:
        if reusable and not self._closed:
            self._idle.append(connection)
        else:
            connection.close()
        self._free_slot()

    def forget(self, connection: _Connection) -> None:
        self._all.discard(connection)

    def _free_slot(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._in_use -= 1
