"""The client socket server's limits (issue 12, finding 6), in process against a stand-in
engine: connections past the caps are closed with a log line naming the limit, one that
never registers is closed at its deadline, and a connection that fails while accepted does
not stop the accepting."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelswap_api.wire import Message, Peer, reply_to
from modelswap_sidecar.engine import server as server_module
from modelswap_sidecar.engine.server import EngineServer
from modelswap_sidecar.engine.settings import EngineSettings
from tests.support.waiting import wait_for


class StandInEngine:
    """What the server uses of an `Engine`; every request registers its connection."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.bound: set[int] = set()
        self.gone: list[Peer] = []

    def handle(self, peer: Peer, message: Message) -> Message:
        self.bound.add(id(peer))
        return reply_to(message, 0)

    def client_gone(self, peer: Peer) -> None:
        self.bound.discard(id(peer))
        self.gone.append(peer)

    def registered(self, peer: Peer) -> bool:
        return id(peer) in self.bound


def start(tmp_path: Path, **limits: Any) -> tuple[EngineServer, StandInEngine]:
    engine = StandInEngine(EngineSettings(**limits))
    srv = EngineServer(engine, tmp_path / "agent.sock")  # type: ignore[arg-type]
    srv.start()
    return srv, engine


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for s in opened:
        s.close()


def connect(srv: EngineServer, opened: list[socket.socket]) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(5)
    s.connect(str(srv.path))
    opened.append(s)
    return s


def closed_by_server(s: socket.socket, timeout_seconds: float = 5) -> bool:
    s.settimeout(timeout_seconds)
    try:
        return s.recv(4096) == b""
    except TimeoutError:
        return False


def test_a_connection_past_the_cap_per_process_is_closed_and_the_limit_logged(
    tmp_path: Path, sockets: list[socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    srv, _ = start(tmp_path, max_connections_per_process=2)
    try:
        with caplog.at_level(logging.WARNING, logger=server_module.__name__):
            kept = [connect(srv, sockets) for _ in range(2)]
            wait_for(lambda: srv.connections == 2, 5, "two connections accepted")
            assert closed_by_server(connect(srv, sockets))
        assert "max_connections_per_process" in caplog.text
        assert not any(closed_by_server(s, 0.1) for s in kept)
        kept[0].close()
        wait_for(lambda: srv.connections == 1, 5, "a closed connection counted out")
        assert not closed_by_server(connect(srv, sockets), 0.2)  # room again
    finally:
        srv.close()


def test_a_connection_past_the_cap_in_all_is_closed_and_the_limit_logged(
    tmp_path: Path, sockets: list[socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    srv, _ = start(tmp_path, max_connections=1)
    try:
        with caplog.at_level(logging.WARNING, logger=server_module.__name__):
            connect(srv, sockets)
            wait_for(lambda: srv.connections == 1, 5, "one connection accepted")
            assert closed_by_server(connect(srv, sockets))
        assert "max_connections)" in caplog.text
    finally:
        srv.close()


def test_an_unregistered_connection_is_closed_at_the_deadline_a_registered_one_kept(
    tmp_path: Path, sockets: list[socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    srv, engine = start(tmp_path, register_timeout_seconds=0.3)
    try:
        registered = connect(srv, sockets)
        registered.send(b'{"op":"register","id":1}')
        assert b'"ok":true' in registered.recv(4096)
        with caplog.at_level(logging.INFO, logger=server_module.__name__):
            idle = connect(srv, sockets)
            assert closed_by_server(idle)
        assert "register_timeout_seconds" in caplog.text
        assert not closed_by_server(registered, 0.5)
        wait_for(lambda: srv.connections == 1, 5, "the idle one counted out")
        assert len(engine.gone) == 1
    finally:
        srv.close()


def test_a_connection_that_fails_when_accepted_does_not_stop_the_accepting(
    tmp_path: Path, sockets: list[socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = server_module.peer_credentials
    calls = 0

    def fails_once(conn: socket.socket) -> tuple[int, int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("no credentials")
        return real(conn)

    monkeypatch.setattr(server_module, "peer_credentials", fails_once)
    srv, _ = start(tmp_path)
    try:
        assert closed_by_server(connect(srv, sockets))
        served = connect(srv, sockets)
        served.send(b'{"op":"heartbeat","id":1}')
        assert b'"ok":true' in served.recv(4096)
    finally:
        srv.close()
