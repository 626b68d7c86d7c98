"""`wire.Peer` with `PeerLimits` (the agent's side of a client connection, issue 12,
finding 6): a bounded number of handler threads, a bounded number of requests waiting for
one, `Busy` past that, and replies to the handlers' own requests never stuck behind them."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from modelswap_api.wire import (
    ErrorCode,
    Message,
    Op,
    Peer,
    PeerLimits,
    PendingReply,
    reply_to,
)
from tests.support.waiting import wait_for

LIMITS = PeerLimits(2, 3, ("max_handlers_per_connection", "max_waiting_requests_per_connection"))


def handler_threads(name: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name == f"{name}-handler")


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield a, b
    a.close()
    b.close()


def test_requests_past_the_handlers_wait_and_past_the_waiting_are_refused_busy(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    release = threading.Event()

    def slow(_peer: Peer, message: Message) -> Message:
        release.wait(30)
        return reply_to(message, 0, {"n": message.body["n"]})

    server = Peer(pair[0], slow, name="limited", limits=LIMITS)
    client = Peer(pair[1], lambda _p, m: None, name="asker")
    server.start()
    client.start()
    try:
        # 2 handled + 3 waiting are taken; the next 4 are refused at once, naming the limits
        pending: list[PendingReply] = [
            client.request_start(Op.HEARTBEAT, {"n": n}) for n in range(9)
        ]
        for p in pending[5:]:
            reply = p.wait(5)
            assert not reply.ok and reply.error_code is ErrorCode.BUSY
            assert "max_waiting_requests_per_connection=3" in reply.error_message
        assert handler_threads("limited") == 2
        release.set()
        assert [p.wait(10).body["n"] for p in pending[:5]] == [0, 1, 2, 3, 4]
        assert handler_threads("limited") == 2  # the waiting ones ran on the same two
    finally:
        release.set()
        server.close()
        client.close()
    wait_for(lambda: handler_threads("limited") == 0, 10, "handler threads end")


def test_replies_to_the_handlers_own_requests_arrive_while_every_handler_waits(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """Each handler asks the other side something and waits (as the agent's attach sends
    `map`); with both handlers and every waiting slot taken, the replies still come."""

    def asks_back(peer: Peer, message: Message) -> Message:
        answer = peer.request(Op.QUIESCE, {"n": message.body["n"]}, timeout_seconds=10)
        return reply_to(message, 0, answer.body)

    server = Peer(pair[0], asks_back, name="asking", limits=LIMITS)
    client = Peer(pair[1], lambda _p, m: reply_to(m, 0, {"back": m.body["n"]}), name="answers")
    server.start()
    client.start()
    try:
        pending = [client.request_start(Op.ATTACH, {"n": n}) for n in range(5)]
        assert [p.wait(10).body["back"] for p in pending] == [0, 1, 2, 3, 4]
    finally:
        server.close()
        client.close()


def memfds_named(name: str) -> int:
    """How many fds this process holds of memfds called `name`."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{name} ")
    return count


def test_closing_with_requests_waiting_closes_their_fds(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    release = threading.Event()

    def slow(_peer: Peer, message: Message) -> Message:
        release.wait(30)
        message.close_fds()
        return reply_to(message, 0)

    server = Peer(pair[0], slow, name="closing", limits=LIMITS)
    server.start()
    client = Peer(pair[1], lambda _p, m: None, name="sender")
    client.start()
    fd = os.memfd_create("peer-limits-waiting")
    try:
        for _ in range(2):
            client.request_start(Op.HEARTBEAT)
        wait_for(lambda: handler_threads("closing") == 2, 10, "both handlers busy")
        client.request_start(Op.COMMIT, fds=[fd])  # waits; the server receives a duplicate
        wait_for(lambda: memfds_named("peer-limits-waiting") == 2, 10, "the fd received")
        server.close()
        assert memfds_named("peer-limits-waiting") == 1  # the waiting request's was closed
    finally:
        release.set()
        os.close(fd)
        server.close()
        client.close()
    wait_for(lambda: handler_threads("closing") == 0, 10, "handler threads end")
