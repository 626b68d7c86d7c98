from __future__ import annotations

import array
import os
import socket

import pytest

from modelswap_api import wire
from modelswap_api.wire import Channel, Message, Op, ProtocolError


def test_more_than_253_fds_travel_in_batches() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds = [os.memfd_create(f"t{i}") for i in range(600)]
    try:
        inodes = [os.fstat(fd).st_ino for fd in fds]
        Channel(a).send(Message(Op.MAP, 7, 3, {"x": 1}, fds))
        got = Channel(b).recv()
        assert got is not None and got.msg_id == 7 and got.body == {"x": 1}
        assert [os.fstat(fd).st_ino for fd in got.fds] == inodes
        got.close_fds()
    finally:
        for fd in fds:
            os.close(fd)
        a.close()
        b.close()


def test_truncated_control_message_is_refused_and_leaks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds = [os.memfd_create(f"t{i}") for i in range(4)]
    try:
        a.sendmsg(
            [b'{"op":"map","id":1,"nfds":4}'],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))],
        )
        before = sorted(os.listdir("/proc/self/fd"))
        monkeypatch.setattr(wire, "MAX_FDS_PER_PACKET", 1)  # the receiver expects one fd
        with pytest.raises(ProtocolError, match="truncated"):
            Channel(b).recv()
        assert sorted(os.listdir("/proc/self/fd")) == before  # the fd that arrived was closed
    finally:
        for fd in fds:
            os.close(fd)
        a.close()
        b.close()
