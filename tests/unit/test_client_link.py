"""The client's link to the agent when registration does not succeed: the connection is
closed (the agent sees it end) and no reader thread is left behind, whether the agent
refused the registration or never answered it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from modelswap_api.wire import Channel, ErrorCode, Op, error_reply
from modelswap_client._copier import Copier
from modelswap_client._facts import AgentFacts
from modelswap_client._gate import StateGate
from modelswap_client._handler import AgentHandler
from modelswap_client._hooks import Hooks
from modelswap_client._kvhost import KvHostTier
from modelswap_client._link import AgentLink
from modelswap_client.errors import ClientError
from modelswap_client.mappers.sim import SimMapper
from modelswap_client.regions import Regions

Answer = Callable[[Channel], None]


def refuse(channel: Channel) -> None:
    request = channel.recv()
    assert request is not None and request.op is Op.REGISTER
    channel.send(error_reply(request, 1, ErrorCode.NOT_VOUCHED, "model 'm' is not known here"))


def stay_silent(channel: Channel) -> None:
    channel.recv()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Callable[[Answer], tuple[str, threading.Event]]]:
    """A one-connection fake agent: `answer` handles the registration, then the fake waits
    for the client to close the connection and sets the event it returned."""
    listeners: list[socket.socket] = []

    def start(answer: Answer) -> tuple[str, threading.Event]:
        path = str(tmp_path / f"agent-{len(listeners)}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(path)
        listener.listen(1)
        listeners.append(listener)
        closed = threading.Event()

        def serve() -> None:
            conn, _ = listener.accept()
            channel = Channel(conn)
            answer(channel)
            conn.settimeout(10)
            try:
                while conn.recv(1 << 16):
                    pass
                closed.set()  # the client ended the connection
            except OSError:
                pass
            finally:
                conn.close()

        threading.Thread(target=serve, daemon=True).start()
        return path, closed

    yield start
    for listener in listeners:
        listener.close()


def link(socket_path: str, mapper: SimMapper, timeout_seconds: float) -> AgentLink:
    gate, facts, hooks = StateGate("m"), AgentFacts(), Hooks()
    regions = Regions(mapper)
    handler = AgentHandler(
        "m", mapper, gate=gate, facts=facts, regions=regions,
        copier=Copier(mapper, regions, 1 << 20), kv_host=KvHostTier(mapper), hooks=hooks,
    )  # fmt: skip
    return AgentLink(
        socket_path, "m", "i0", handler=handler, gate=gate, facts=facts, hooks=hooks,
        timeout_seconds=timeout_seconds, reconnect_timeout_seconds=1,
        heartbeat_interval_seconds=0,
    )  # fmt: skip


def readers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "m/i0-reader"]


@pytest.mark.parametrize(
    ("answer", "raised"),
    [(refuse, ClientError), (stay_silent, TimeoutError)],
    ids=["refused", "never answered"],
)
def test_a_registration_that_fails_closes_its_connection(
    agent: Callable[[Answer], tuple[str, threading.Event]],
    answer: Answer,
    raised: type[Exception],
) -> None:
    path, closed = agent(answer)
    mapper = SimMapper()
    try:
        with pytest.raises(raised):
            link(path, mapper, timeout_seconds=0.5).open()
        assert closed.wait(5), "the agent still holds the connection"
        for thread in threading.enumerate():
            if thread.name == "m/i0-reader":
                thread.join(5)
        assert readers() == []
    finally:
        mapper.close()
