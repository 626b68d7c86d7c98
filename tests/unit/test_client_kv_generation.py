"""The client's `kv_generation`: counted up whenever the KV regions' bytes are lost (an
unmap that discarded them or dropped the model, a restore that maps a KV region fresh),
left alone by a preserving swap; and the KV report a heartbeat carries."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from modelswap_api.wire import Message, Op, Peer
from modelswap_client._copier import Copier
from modelswap_client._facts import AgentFacts
from modelswap_client._gate import ClientState, StateGate
from modelswap_client._handler import AgentHandler
from modelswap_client._hooks import Hooks
from modelswap_client._kvhost import KvHostTier
from modelswap_client.mappers.sim import SimMapper
from modelswap_client.regions import Regions, RegionSpec
from tests.unit.test_client_link import link

MIB = 1 << 20
NO_PEER = cast(Peer, None)


class World:
    def __init__(self) -> None:
        self.mapper = SimMapper()
        self.gate, self.facts = StateGate("m"), AgentFacts()
        self.regions = Regions(self.mapper)
        self.regions.reserve([RegionSpec("w", 2 * MIB), RegionSpec("kv", 2 * MIB, "kv")])
        self.handler = AgentHandler(
            "m",
            self.mapper,
            gate=self.gate,
            facts=self.facts,
            regions=self.regions,
            copier=Copier(self.mapper, self.regions, 32 * MIB),
            kv_host=KvHostTier(self.mapper),
            hooks=Hooks(),
        )
        self.ids = iter(range(1, 1000))

    def ask(self, op: Op, body: dict[str, Any] | None = None, fds: list[int] | None = None) -> None:
        message = Message(op, next(self.ids), self.facts.epoch, body or {}, fds or [])
        reply = self.handler.handle(NO_PEER, message)
        assert reply.ok, reply.error_message

    def swap_in(self, *, kv_fresh: bool) -> None:
        chunks = [memfd(2 * MIB), memfd(2 * MIB)]
        self.ask(
            Op.MAP,
            {
                "regions": [
                    {"tag": tag, "chunks": [{"offset": 0, "bytes": 2 * MIB, "fd": i}]}
                    for i, tag in enumerate(("w", "kv"))
                ]
            },
            chunks,
        )
        copies = [memfd(2 * MIB)]
        docs: list[dict[str, Any]] = [{"tag": "w", "fd": 0, "bytes": 2 * MIB}]
        if kv_fresh:
            docs.append({"tag": "kv", "fresh": True})
        else:
            copies.append(memfd(2 * MIB))
            docs.append({"tag": "kv", "fd": 1, "bytes": 2 * MIB})
        self.ask(Op.RESTORE, {"regions": docs}, copies)

    def swap_out(self, body: dict[str, Any]) -> None:
        self.ask(Op.QUIESCE)
        self.ask(Op.UNMAP, body)


def memfd(size_bytes: int) -> int:
    fd = os.memfd_create("modelswap-test")
    os.ftruncate(fd, size_bytes)
    return fd


@pytest.fixture
def w() -> Iterator[World]:
    world = World()
    world.gate.set(ClientState.SWAPPED_OUT)
    yield world
    world.handler.release()
    world.mapper.close()


def test_a_preserving_swap_keeps_the_generation(w: World) -> None:
    w.swap_in(kv_fresh=False)
    w.swap_out({"kv_discarded": False})
    w.swap_in(kv_fresh=False)
    assert w.facts.kv_generation == 0


def test_a_discard_counts_at_the_unmap_before_the_memory_is_back(w: World) -> None:
    w.swap_in(kv_fresh=False)
    w.swap_out({"kv_discarded": True})
    assert w.facts.kv_generation == 1
    w.swap_in(kv_fresh=False)  # even restored from an older copy: still lost
    assert w.facts.kv_generation == 1


def test_a_drop_counts_though_kv_was_not_discarded(w: World) -> None:
    w.swap_in(kv_fresh=False)
    w.swap_out({"kv_discarded": False, "dropped": True})
    assert w.facts.kv_generation == 1


def test_a_fresh_kv_region_on_restore_counts(w: World) -> None:
    w.swap_in(kv_fresh=True)  # a failure path mapped it fresh without an unmap saying so
    assert w.facts.kv_generation == 1


def test_a_heartbeat_carries_the_kv_report_and_leaves_a_failing_one_out(tmp_path: Path) -> None:
    mapper = SimMapper()
    try:
        agent_link = link(str(tmp_path / "none.sock"), mapper, 1.0)
        assert agent_link._beat() == {}
        agent_link.kv_report = lambda: {"hits": 3}
        assert agent_link._beat() == {"kv": {"hits": 3}}

        def broken() -> dict[str, int]:
            raise RuntimeError("no figures")

        agent_link.kv_report = broken
        assert agent_link._beat() == {}
    finally:
        mapper.close()
