"""The client's agent handler with no agent: the agent's requests handed in as messages
(the `Peer` is not used for answers), against a sim mapper and memfds."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from modelswap_api.wire import ErrorCode, Message, Op, Peer
from modelswap_client._copier import Copier
from modelswap_client._facts import AgentFacts
from modelswap_client._gate import ClientState, StateGate
from modelswap_client._handler import AgentHandler
from modelswap_client._hooks import Hooks
from modelswap_client._kvhost import KvHostTier
from modelswap_client.mappers.sim import SimMapper
from modelswap_client.regions import Regions, RegionSpec

MIB = 1 << 20
S = ClientState
NO_PEER = cast(Peer, None)  # `handle` answers by its return value, never through the peer


@dataclass
class Parts:
    mapper: SimMapper
    gate: StateGate
    facts: AgentFacts
    regions: Regions
    hooks: Hooks
    handler: AgentHandler
    events: list[str] = field(default_factory=list)
    msg_ids: Iterator[int] = field(default_factory=lambda: iter(range(1, 1000)))

    def ask(
        self,
        op: Op,
        body: dict[str, Any] | None = None,
        fds: list[int] | None = None,
        epoch: int | None = None,
    ) -> Message:
        message = Message(
            op,
            next(self.msg_ids),
            self.facts.epoch if epoch is None else epoch,
            body or {},
            fds or [],
        )
        return self.handler.handle(NO_PEER, message)


def memfd(size_bytes: int, fill: bytes = b"") -> int:
    fd = os.memfd_create("modelswap-test")
    os.ftruncate(fd, size_bytes)
    if fill:
        os.pwrite(fd, fill * size_bytes, 0)
    return fd


@pytest.fixture
def p() -> Iterator[Parts]:
    mapper = SimMapper()
    gate, facts, hooks = StateGate("m"), AgentFacts(), Hooks()
    regions = Regions(mapper)
    regions.reserve([RegionSpec("w", 4 * MIB)])
    copier = Copier(mapper, regions, 32 * MIB)
    handler = AgentHandler(
        "m",
        mapper,
        gate=gate,
        facts=facts,
        regions=regions,
        copier=copier,
        kv_host=KvHostTier(mapper),
        hooks=hooks,
    )
    p = Parts(mapper, gate, facts, regions, hooks, handler)
    hooks.swap_out.append(lambda: p.events.append("swap_out"))
    hooks.swap_in.append(lambda: p.events.append("swap_in"))
    yield p
    handler.release()
    mapper.close()


def map_and_restore(p: Parts, fill: bytes, *, fresh: bool = False) -> Message:
    chunk = memfd(4 * MIB)
    reply = p.ask(
        Op.MAP,
        {"regions": [{"tag": "w", "chunks": [{"offset": 0, "bytes": 4 * MIB, "fd": 0}]}]},
        [chunk],
    )
    assert reply.ok, reply.error_message
    assert p.gate.state is S.MAPPED
    if fresh:
        return p.ask(Op.RESTORE, {"regions": [{"tag": "w", "fresh": True}]})
    copy = memfd(4 * MIB, fill)
    try:
        return p.ask(
            Op.RESTORE, {"regions": [{"tag": "w", "fd": 0, "bytes": 4 * MIB}]}, [os.dup(copy)]
        )
    finally:
        os.close(copy)


def test_a_swap_out_and_in_runs_the_models_handlers_and_restores_its_bytes(p: Parts) -> None:
    p.gate.set(S.SWAPPED_OUT)  # attached, then swapped out
    reply = map_and_restore(p, b"a")
    assert reply.ok and reply.body["regions"] == {"w": "restored"}
    assert reply.body["copy"]["bytes"] == 4 * MIB
    assert p.gate.state is S.RESIDENT and p.events == ["swap_in"]
    w = p.regions["w"]
    assert ctypes.string_at(w.address, 8) == b"aaaaaaaa"

    p.facts.epoch = 2
    assert p.ask(Op.QUIESCE).ok
    assert p.gate.state is S.QUIESCED and p.events == ["swap_in", "swap_out"]
    assert p.ask(Op.UNMAP, {"kv_discarded": True}).ok
    assert p.gate.state is S.SWAPPED_OUT and w.handles == []
    assert p.facts.kv_discarded and not p.facts.dropped


def test_a_drop_then_a_fresh_swap_in_asks_for_a_reload(p: Parts) -> None:
    p.gate.set(S.SWAPPED_OUT)
    p.facts.restored = p.facts.committed = True
    assert map_and_restore(p, b"a").ok
    assert p.ask(Op.QUIESCE).ok
    assert p.ask(Op.UNMAP, {"dropped": True}).ok
    assert p.facts.dropped and not p.facts.restored and not p.facts.committed
    p.facts.restored = p.facts.committed = True  # as if the agent said so meanwhile
    reply = map_and_restore(p, b"", fresh=True)
    assert reply.body["regions"] == {"w": "fresh"}
    assert not p.facts.dropped and not p.facts.restored and not p.facts.committed


def test_a_stale_request_is_refused_and_its_fds_closed(p: Parts) -> None:
    p.facts.epoch = 5
    fd = memfd(4 * MIB)
    reply = p.ask(Op.SAVE, {"regions": []}, [fd], epoch=4)
    assert not reply.ok and reply.error_code is ErrorCode.STALE
    with pytest.raises(OSError):
        os.fstat(fd)


def test_an_unknown_request_and_a_failing_one_are_answered_with_errors(p: Parts) -> None:
    reply = p.ask(Op.HEARTBEAT)
    assert not reply.ok and reply.error_code is ErrorCode.PROTOCOL
    p.gate.set(S.SWAPPED_OUT)
    reply = p.ask(Op.QUIESCE)  # not resident
    assert not reply.ok and reply.error_code is ErrorCode.INTERNAL
    assert p.gate.state is S.SWAPPED_OUT


def test_a_removed_model_is_unmapped_for_good(p: Parts) -> None:
    p.gate.set(S.SWAPPED_OUT)
    assert map_and_restore(p, b"a").ok
    assert p.ask(Op.REMOVED).ok
    assert p.gate.state is S.REMOVED and p.gate.ended
    assert p.regions["w"].handles == []


def test_a_lost_agent_mid_swap_in_rolls_back_to_swapped_out(p: Parts) -> None:
    p.gate.set(S.SWAPPED_OUT)
    chunk = memfd(4 * MIB)
    body = {"regions": [{"tag": "w", "chunks": [{"offset": 0, "bytes": 4 * MIB, "fd": 0}]}]}
    assert p.ask(Op.MAP, body, [chunk]).ok
    p.handler.roll_back()
    assert p.gate.state is S.SWAPPED_OUT and p.regions["w"].handles == []


def test_a_lost_agent_mid_swap_out_resumes_the_model(p: Parts) -> None:
    p.gate.set(S.SWAPPED_OUT)
    assert map_and_restore(p, b"a").ok
    assert p.ask(Op.QUIESCE).ok
    p.handler.roll_back()
    assert p.gate.state is S.RESIDENT and len(p.regions["w"].handles) == 1


class FakeAgent:
    """Answers READOPT as a restarted agent would; records what it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[Op, dict[str, Any], int, int]] = []

    def request(
        self, op: Op, body: dict[str, Any], epoch: int, fds: list[int], *, timeout_seconds: float
    ) -> Message:
        self.sent.append((op, body, epoch, len(fds)))
        return Message(Op.REPLY, 0, 9, {"committed": True})


def test_readopt_reexports_every_chunk_of_a_resident_model_and_closes_them(p: Parts) -> None:
    p.gate.set(S.SWAPPED_OUT)
    assert map_and_restore(p, b"a").ok
    agent = FakeAgent()
    before = set(os.listdir("/proc/self/fd"))
    p.handler.readopt(cast(Peer, agent), timeout_seconds=5.0)
    assert set(os.listdir("/proc/self/fd")) == before
    ((op, body, _, nfds),) = agent.sent
    assert op is Op.READOPT and body["state"] == "resident" and nfds == 1
    assert p.facts.epoch == 9 and p.facts.committed


def test_readopt_of_a_swapped_out_model_sends_layouts_only(p: Parts) -> None:
    p.gate.set(S.SWAPPED_OUT)
    agent = FakeAgent()
    p.handler.readopt(cast(Peer, agent), timeout_seconds=5.0)
    ((_, body, _, nfds),) = agent.sent
    assert body["state"] == "swapped_out" and nfds == 0
    assert body["regions"][0]["chunks"] == []
