"""Client-socket messages that announce fds they never send (issue 12, deliverable 2): a
reader waited for ever for continuation packets that could not come, holding its thread;
now a short batch is refused at once, and a missing continuation after a short wait, with
every fd that did arrive closed."""

from __future__ import annotations

import array
import os
import socket
import time

import pytest

from modelswap_api import wire
from modelswap_api.wire import Channel, ProtocolError
from tests.support.reliability import record


def send(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([data], ancillary)


def test_a_message_announcing_more_fds_than_its_packet_carries_is_refused_at_once() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds = [os.memfd_create(f"t{i}") for i in range(2)]
    try:
        send(a, b'{"op":"map","id":1,"nfds":4}', fds)
        before = sorted(os.listdir("/proc/self/fd"))
        started = time.monotonic()
        with pytest.raises(ProtocolError, match="announcing 4 fds carries 2, not 4"):
            Channel(b).recv()
        seconds = time.monotonic() - started
        assert sorted(os.listdir("/proc/self/fd")) == before  # the 2 that came were closed
    finally:
        for fd in fds:
            os.close(fd)
        a.close()
        b.close()
    record("inputs", input="client socket: a message announcing 4 fds, carrying 2",
           limit="each packet carries min(253, fds still due)", outcome="ProtocolError",
           answered_seconds=round(seconds, 4))  # fmt: skip


def test_a_continuation_that_never_comes_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MAX_FDS_PER_PACKET", 2)
    monkeypatch.setattr(wire, "CONTINUATION_TIMEOUT_SECONDS", 0.3)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds = [os.memfd_create(f"t{i}") for i in range(2)]
    try:
        send(a, b'{"op":"map","id":1,"nfds":4}', fds)  # and no continuation
        before = sorted(os.listdir("/proc/self/fd"))
        started = time.monotonic()
        with pytest.raises(ProtocolError, match=r"no fds continuation within 0\.3 s"):
            Channel(b).recv()
        seconds = time.monotonic() - started
        assert 0.25 < seconds < 5
        assert sorted(os.listdir("/proc/self/fd")) == before
    finally:
        for fd in fds:
            os.close(fd)
        a.close()
        b.close()
    record("inputs", input="client socket: fds announced, continuation never sent",
           limit="wire.CONTINUATION_TIMEOUT_SECONDS (5 s; 0.3 s in this test)",
           outcome="ProtocolError", answered_seconds=round(seconds, 3))  # fmt: skip


def test_a_short_continuation_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MAX_FDS_PER_PACKET", 2)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds = [os.memfd_create(f"t{i}") for i in range(3)]
    try:
        send(a, b'{"op":"map","id":1,"nfds":4}', fds[:2])
        send(a, b'{"op":"fds","id":0,"re":1,"nfds":1}', fds[2:])
        with pytest.raises(ProtocolError, match="announcing 4 fds carries 1, not 2"):
            Channel(b).recv()
    finally:
        for fd in fds:
            os.close(fd)
        a.close()
        b.close()
