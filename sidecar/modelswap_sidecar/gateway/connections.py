"""Caps on an HTTP server's open client connections, so that a flood of connections cannot
take the file descriptors the rest of the node needs (issue 26, item 2).

The agent is one process: the gateway's client connections, the control API's and the
metrics server's, the engine's (model processes' sockets, memory chunks passed as fds),
the connections to Triton, state files and logs all come out of one soft RLIMIT_NOFILE.
4,200 idle connections at a limit of 4,096 once left nothing for the engine (a write failed
with "Too many open files") and no room for a probe. So each server holds at most
`max_connections` client connections, `max_connections_per_address` of them from one
client address, and the gateway's cap leaves `reserve_file_descriptors` to the rest
(`plan_caps`, from the limit read when the gateway starts).

    limiter = ConnectionLimiter(caps, server="gateway", setting="gateway.maxConnections")
    limiter.attach(runner.server)  # a web.Server, before its site accepts connections

The control API and the metrics server get the same guard with fixed caps out of the
gateway's reserve (`control_caps`, `metrics_caps`); they close a refused connection at once.
The gateway's gRPC front is capped by gRPC core itself (`grpc_max_connections`).

A connection over a cap makes room first: the longest-idle connections under that cap (no
request in flight, waiting for the next one's headers, as aiohttp's own keep-alive expiry
judges it) are closed, a batch at a time (one scan of the connections per batch, not per
connection accepted). When none is idle it is refused: with `answers_refusals` its first
request is answered 503 `TooManyConnections` with `Retry-After` and the connection closed
(`refusing` holds it until then, at most `MAX_REFUSING` of them and for at most
`REFUSAL_GRACE_SECONDS`); else, or past those, it is closed at once. A burst of closes and
refusals is logged once when it starts and once when it is over (`QUIET_SECONDS` later),
never per connection; the counts stay in `closed_idle` and `refused` by cap, for metrics.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import os
import resource
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

logger = logging.getLogger(__name__)

#: What a process may hold when its limit is unlimited (/proc/sys/fs/nr_open's default).
FD_CEILING = 1 << 20
#: The default reserve: a quarter of the limit, at least this many (and at most half).
MIN_RESERVE_FDS = 1024
#: Refused connections held open at once to answer them 503 (more are closed unanswered).
MAX_REFUSING = 64
#: Longest a refused connection may take to send the request its 503 answers.
REFUSAL_GRACE_SECONDS = 2.0
#: A burst of closes and refusals is over after this long without one.
QUIET_SECONDS = 10.0
#: Idle connections closed per scan: this fraction of a cap (at least one), so a flood
#: at the cap costs one scan of the connections per batch, not per connection accepted.
BATCH_FRACTION = 32

#: The caps' names, as metrics label them.
MAX_CONNECTIONS = "max_connections"
MAX_CONNECTIONS_PER_ADDRESS = "max_connections_per_address"
CAPS = (MAX_CONNECTIONS, MAX_CONNECTIONS_PER_ADDRESS)


class CapsError(ValueError):
    """The configured caps do not fit this process's open-files limit (names the field)."""


@dataclass(frozen=True, kw_only=True)
class ConnectionCaps:
    max_connections: int
    max_connections_per_address: int

    def __post_init__(self) -> None:
        if not 1 <= self.max_connections_per_address <= self.max_connections:
            raise ValueError(f"caps out of order: {self}")


def control_caps(limit: int) -> ConnectionCaps:
    """The control API's caps under an open-files `limit`: a 16th of it, at most 256, half
    of that from one address (the operator needs a few connections from one address).
    They come out of the gateway's reserve."""
    cap = max(2, min(256, limit // 16))
    return ConnectionCaps(max_connections=cap, max_connections_per_address=cap // 2)


def metrics_caps(limit: int) -> ConnectionCaps:
    """The metrics server's caps: a 64th of the limit, at most 64, a quarter of that from
    one address (Prometheus scrapes over one connection). Out of the gateway's reserve."""
    cap = max(4, min(64, limit // 64))
    return ConnectionCaps(max_connections=cap, max_connections_per_address=cap // 4)


def grpc_max_connections(limit: int) -> int:
    """The gateway gRPC front's connection cap: a 32nd of the limit, at most 128, out of
    the gateway's reserve. A gRPC client multiplexes its calls over one connection per
    channel, so few are needed; gRPC core closes a connection over the cap as it is
    accepted (it has no per-address cap and closes no idle one to make room: idle ones
    are closed after `GrpcSettings.idle_close_seconds`)."""
    return max(4, min(128, limit // 32))


def open_files_limit() -> int:
    """The soft RLIMIT_NOFILE (unlimited: `FD_CEILING`)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return FD_CEILING if soft == resource.RLIM_INFINITY or soft > FD_CEILING else soft


def open_fds() -> int:
    """File descriptors this process holds now (0 where /proc cannot say)."""
    try:
        return max(len(os.listdir("/proc/self/fd")) - 1, 0)  # less the listing's own
    except OSError:
        return 0


def default_reserve_fds(limit: int) -> int:
    return min(max(MIN_RESERVE_FDS, limit // 4), limit // 2)


def plan_caps(
    *,
    limit: int,
    open_now: int,
    max_connections: int | None,
    max_connections_per_address: int | None,
    reserve_file_descriptors: int | None,
) -> ConnectionCaps:
    """The gateway's caps under an open-files `limit` with `open_now` fds open: the
    configured ones, or (None) the room the reserve leaves and a quarter of it per address.
    CapsError names the `gateway.` field that cannot fit."""
    reserve = (
        default_reserve_fds(limit) if reserve_file_descriptors is None else reserve_file_descriptors
    )
    room = limit - open_now - reserve
    where = f"this process's open-files limit is {limit} with {open_now} open already"
    if max_connections is None:
        if room < 1:
            raise CapsError(
                f"gateway.reserveFileDescriptors: {reserve} file descriptors in reserve leave "
                f"no room for the gateway's connections ({where})"
            )
        cap = room
    elif max_connections > room:
        raise CapsError(
            f"gateway.maxConnections: {max_connections} connections with {reserve} file "
            f"descriptors in reserve (gateway.reserveFileDescriptors) need an open-files "
            f"limit of at least {max_connections + reserve + open_now}; {where}"
        )
    else:
        cap = max_connections
    if max_connections_per_address is None:
        per_address = max(1, cap // 4)
    elif max_connections_per_address > cap:
        raise CapsError(
            f"gateway.maxConnectionsPerAddress: {max_connections_per_address} is more than "
            f"the gateway's {cap} connections in all (gateway.maxConnections)"
        )
    else:
        per_address = max_connections_per_address
    return ConnectionCaps(max_connections=cap, max_connections_per_address=per_address)


def _idle(handler: RequestHandler) -> bool:
    """No request in flight: waiting for the next request's headers (aiohttp's keep-alive
    expiry closes a connection only in this state, too)."""
    waiter = handler._waiter
    return waiter is not None and not waiter.done() and not handler._force_close


def _idle_since(handler: RequestHandler) -> float:
    # aiohttp moves the keep-alive deadline to now + timeout when a connection is accepted
    # and when each request ends; the timeout is one per server, so the earliest deadline
    # is the longest idle
    return handler._next_keepalive_close_time


def _address(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return ""


@dataclass
class _Burst:
    began_seconds: float
    last_seconds: float
    closed_idle: int = 0
    refused: int = 0


class ConnectionLimiter:
    """Keeps one server's client connections within `caps` (see the module docstring)."""

    def __init__(
        self,
        caps: ConnectionCaps,
        *,
        server: str,
        setting: str | None = None,
        answers_refusals: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.caps = caps
        self.server = server
        self.setting = setting
        self.answers_refusals = answers_refusals
        self._clock = clock
        self._open: dict[RequestHandler, str] = {}  # connection -> client address
        self._by_address: dict[str, dict[RequestHandler, None]] = {}
        #: refused connections whose first request is answered 503 (`answers_refusals`)
        self.refusing: set[RequestHandler] = set()
        self._refusal_timers: dict[RequestHandler, asyncio.TimerHandle] = {}
        self.closed_idle = dict.fromkeys(CAPS, 0)
        self.refused = dict.fromkeys(CAPS, 0)
        self._burst: _Burst | None = None
        self._batch = max(1, caps.max_connections // BATCH_FRACTION)
        self._batch_per_address = max(1, caps.max_connections_per_address // BATCH_FRACTION)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def attach(self, server: web.Server) -> None:
        """Watch `server`'s connections: its `connection_made` and `connection_lost` (which
        each connection's protocol calls) are wrapped on this one instance."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self.admit(handler, transport)

        def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
            self.forget(handler)
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    # -- per connection
    def admit(self, handler: RequestHandler, transport: asyncio.BaseTransport) -> None:
        """A connection was accepted: keep it (closing idle ones to make room) or refuse it."""
        address = _address(transport)
        peers = self._by_address.get(address)
        per_address = MAX_CONNECTIONS_PER_ADDRESS
        if (
            peers is not None
            and len(peers) >= self.caps.max_connections_per_address
            and not self._close_idle(peers, self._batch_per_address, per_address)
        ):
            self._refuse(handler, per_address)
            return
        if len(self._open) >= self.caps.max_connections and not self._close_idle(
            self._open, self._batch, MAX_CONNECTIONS
        ):
            self._refuse(handler, MAX_CONNECTIONS)
            return
        self._open[handler] = address
        if peers is None:
            peers = self._by_address[address] = {}
        peers[handler] = None

    def forget(self, handler: RequestHandler) -> None:
        """A connection closed."""
        self._drop(handler)
        if self.refusing:
            self.refusing.discard(handler)
            timer = self._refusal_timers.pop(handler, None)
            if timer is not None:
                timer.cancel()

    def _drop(self, handler: RequestHandler) -> None:
        address = self._open.pop(handler, None)
        if address is None:
            return
        peers = self._by_address[address]
        del peers[handler]
        if not peers:
            del self._by_address[address]

    def _close_idle(self, pool: Iterable[RequestHandler], batch: int, cap: str) -> bool:
        """Close up to `batch` of `pool`'s longest-idle connections; False when none is."""
        victims = heapq.nsmallest(batch, (h for h in pool if _idle(h)), key=_idle_since)
        if not victims:
            return False
        self.closed_idle[cap] += len(victims)
        self._note(closed_idle=len(victims), cap=cap)
        for handler in victims:
            self._drop(handler)  # now: the connection being admitted takes its place
            handler.force_close()
        return True

    def _refuse(self, handler: RequestHandler, cap: str) -> None:
        self.refused[cap] += 1
        self._note(refused=1, cap=cap)
        if self.answers_refusals and len(self.refusing) < MAX_REFUSING:
            self.refusing.add(handler)
            loop = asyncio.get_running_loop()
            self._refusal_timers[handler] = loop.call_later(
                REFUSAL_GRACE_SECONDS, handler.force_close
            )
        else:
            handler.force_close()

    # -- a burst's two log lines
    def _note(self, *, cap: str, closed_idle: int = 0, refused: int = 0) -> None:
        now = self._clock()
        burst = self._burst
        if burst is None:
            burst = self._burst = _Burst(began_seconds=now, last_seconds=now)
            if cap == MAX_CONNECTIONS:
                cap_value, scope = self.caps.max_connections, "in all"
            else:
                cap_value, scope = self.caps.max_connections_per_address, "from one address"
            setting = ""
            if self.setting is not None:
                suffix = "" if cap == MAX_CONNECTIONS else "PerAddress"
                setting = f" ({self.setting}{suffix})"
            logger.warning(
                "%s: at its cap of %d connections %s%s, %d open: closing the longest-idle "
                "ones to admit new ones, refusing new ones while none is idle (said once "
                "per burst)",
                self.server,
                cap_value,
                scope,
                setting,
                len(self._open),
            )
            asyncio.get_running_loop().call_later(QUIET_SECONDS, self._end_burst)
        burst.last_seconds = now
        burst.closed_idle += closed_idle
        burst.refused += refused

    def _end_burst(self) -> None:
        burst = self._burst
        if burst is None:
            return
        now = self._clock()
        quiet_for = now - burst.last_seconds
        if quiet_for < QUIET_SECONDS:
            asyncio.get_running_loop().call_later(QUIET_SECONDS - quiet_for, self._end_burst)
            return
        self._burst = None
        logger.warning(
            "%s: a burst at its connection caps is over: %d idle connections closed and %d "
            "refused in %.1f s; %d open now",
            self.server,
            burst.closed_idle,
            burst.refused,
            burst.last_seconds - burst.began_seconds,
            len(self._open),
        )
