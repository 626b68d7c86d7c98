"""Malformed input is refused in one line, never a traceback or a 500 (issue 12, finding 3):
`modelswap validate` on a non-UTF-8 file, control-API bodies that are not UTF-8, nested
100,000 deep or hold non-finite numbers, and client-socket packets with `"id":1e999` or deep
nesting (that connection is closed, logged once; the others go on)."""

from __future__ import annotations

import json
import logging
import random
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from modelswap_api import wire
from modelswap_api.json_input import JsonInputError, loads_bounded, nesting_exceeds
from modelswap_api.wire import Message, Op, Peer, ProtocolError
from modelswap_sidecar.control.app import make_app
from modelswap_sidecar.control.auth import TokenFile
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings
from tests.support.memory_backend import InMemoryBackend

pytestmark = pytest.mark.timeout(60)

AUTH = {"Authorization": "Bearer t"}
DEEP = b"[" * 100_000 + b"]" * 100_000


def test_validate_names_a_non_utf8_file_in_one_line_and_fails(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"apiVersion: modelswap.io/v1alpha1\nkind: ModelDeployment\n# caf\xe9\n")
    script = Path(sys.executable).parent / "modelswap"
    result = subprocess.run(
        [str(script), "validate", str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert result.stderr == ""
    assert f"{bad}: file: not UTF-8 text (byte 61 is not valid UTF-8)\n" in result.stdout


# -- the control API ---------------------------------------------------------------------------


@pytest_asyncio.fixture
async def control(tmp_path: Path) -> Any:
    (tmp_path / "token").write_text("t")
    settings = ControlSettings(
        node_name="n", token_file=tmp_path / "token", state_file=tmp_path / "rev.json"
    )
    service = ControlService(InMemoryBackend("n", {"g": 1 << 30}), settings, clock=lambda: 0.0)
    async with TestClient(TestServer(make_app(service, TokenFile(tmp_path / "token")))) as c:
        yield c


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"revision": "\xff"}', "the body is not UTF-8 (byte 14 is not valid UTF-8)"),
        (DEEP, "the body is nested deeper than 32 levels"),
        (b'{"a":' * 40 + b"1" + b"}" * 40, "is nested deeper than 32 levels"),
        (b'{"revision": {"term": NaN, "counter": 0}}', "NaN is not JSON"),
        (b'{"revision": {"term": 1e999, "counter": 0}}', "number out of range"),
        (b"{not json", "the body is not JSON"),
    ],
)
async def test_a_malformed_body_is_a_400_naming_the_problem(
    control: Any, body: bytes, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    response = await control.put("/v1/desired", data=body, headers=AUTH)
    answer = await response.json()
    assert response.status == 400, answer
    assert answer["reason"] == "Invalid" and expected in answer["message"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    listed = await control.get("/v1/models", headers=AUTH)
    assert listed.status == 200


def test_a_body_nested_too_deep_names_where() -> None:
    """The refusal names the first value past the limit, so a sender finds its bad field."""
    inner = '{"a":' * 31 + "1" + "}" * 31
    body = f'{{"entries": [{{}}, {{"spec": {inner}}}]}}'.encode()
    with pytest.raises(JsonInputError) as refused:
        loads_bounded(body, 32)
    assert refused.value.path == "entries[1].spec" + ".a" * 29
    assert str(refused.value).startswith("entries[1].spec.a.a")
    assert loads_bounded(b'{"entries": [{}, {"spec": {"a": 1}}]}', 32)["entries"][1]


# -- the client socket -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("packet", "expected"),
    [
        (b'{"op":"heartbeat","id":1e999}', "number out of range"),
        (b'{"op":"heartbeat","id":1.5}', "id: expected an integer"),
        (b'{"op":"heartbeat","id":NaN}', "NaN is not JSON"),
        (DEEP, "nested too deeply"),
        (b'{"op":"heartbeat","id":1,"body":[]}', "body: expected an object"),
        (b"\xff\xfe", "malformed packet"),
        (b"[]", "expected an object"),
    ],
)
def test_a_malformed_packet_is_a_protocol_error(packet: bytes, expected: str) -> None:
    with pytest.raises(ProtocolError, match=expected):
        wire._decode(packet)


@pytest.fixture
def thread_errors() -> Iterator[list[BaseException]]:
    """Exceptions that escape any thread (a reader thread dying with a traceback)."""
    caught: list[BaseException] = []
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        caught.append(args.exc_value or RuntimeError("thread died"))

    threading.excepthook = hook
    try:
        yield caught
    finally:
        threading.excepthook = previous


def test_a_malformed_packet_closes_that_connection_only(
    thread_errors: list[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    def echo(peer: Peer, message: Message) -> Message:
        return wire.reply_to(message, message.epoch, {"echo": message.body})

    served: list[Peer] = []
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(3)]
    try:
        for n, (_, agent_end) in enumerate(pairs):
            peer = Peer(agent_end, echo, name=f"client-{n}")
            peer.start()
            served.append(peer)
        with caplog.at_level(logging.WARNING, logger="modelswap_api.wire"):
            pairs[0][0].send(b'{"op":"heartbeat","id":1e999}')
            pairs[1][0].send(DEEP)
            for client_end, _ in pairs[:2]:
                client_end.settimeout(10)
                assert client_end.recv(64) == b""  # closed by the agent's end
        assert served[0].closed and served[1].closed
        lines = [r.getMessage() for r in caplog.records]
        assert sorted(lines) == [
            "client-0: closing the connection: malformed packet: number out of range: 1e999",
            "client-1: closing the connection: malformed packet: nested too deeply",
        ]

        good = Peer(pairs[2][0], echo, name="good")
        good.start()
        answer = good.request(Op.HEARTBEAT, {"n": 1}, timeout_seconds=10)
        assert answer.body == {"echo": {"n": 1}}
        good.close()
        assert thread_errors == []
    finally:
        for peer in served:
            peer.close()
        for client_end, _ in pairs:
            client_end.close()


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


def _nested(rng: random.Random, depth: int) -> object:
    if depth == 0:
        return rng.choice([1, "a[b{", {"k]}": 2}, []])  # brackets inside strings do not count
    if rng.random() < 0.5:
        return [_nested(rng, depth - 1) for _ in range(rng.randint(1, 3))]
    return {'x{"': _nested(rng, depth - 1)}


def test_nesting_is_measured_as_a_parser_would_without_parsing() -> None:
    rng = random.Random(14)
    for _ in range(500):
        value = _nested(rng, rng.randint(0, 9))
        raw, limit = json.dumps(value).encode(), rng.randint(0, 12)
        assert nesting_exceeds(raw, limit) == (_depth(value) > limit), (raw, limit)
    assert nesting_exceeds(b"[" * 200_000 + b"]" * 200_000, 64)
    assert nesting_exceeds(b"[" * 200_000, 64)  # never closed: still that deep to a parser
    assert not nesting_exceeds(b"[" + b"[1.5, 2]," * 100_000 + b"[]]", 64)
