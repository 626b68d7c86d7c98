"""The heartbeat watcher's report of clients that answer nothing (issue 26, item 6):
silent past `unresponsive_after_seconds` since their last heartbeat, or since they
registered when they sent none; once per silence; never a client that keeps beating (one
busy with a long request still does); never with the deadline at 0."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from modelswap_sidecar.engine.heartbeats import Heartbeats, Unresponsive
from modelswap_sidecar.engine.records import InstanceRecord, ModelConfig, ModelRecord
from modelswap_sidecar.engine.states import EngineState


@dataclass
class FakePeer:
    closed: bool = False


@dataclass
class FakeTable:
    models: list[ModelRecord] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def records(self) -> list[ModelRecord]:
        return list(self.models)


def model_with(
    name: str, *, registered_at: float, last_heartbeat: float | None = None, committed: bool = True
) -> tuple[ModelRecord, InstanceRecord]:
    m = ModelRecord(ModelConfig(name, 0), state=EngineState.RESIDENT)
    inst = InstanceRecord("0", peer=FakePeer(), pid=4242, committed=committed)  # type: ignore[arg-type]
    inst.registered_at = registered_at
    inst.last_heartbeat = last_heartbeat
    m.instances["0"] = inst
    return m, inst


def watcher(table: FakeTable, unresponsive_after_seconds: float) -> tuple[Heartbeats, list[Any]]:
    reported: list[Unresponsive] = []
    hb = Heartbeats(table, ledger=None, timeout_seconds=30.0,  # type: ignore[arg-type]
                    unresponsive_after_seconds=unresponsive_after_seconds)  # fmt: skip
    hb.on_unresponsive(reported.append)
    return hb, reported


def test_a_silent_client_is_reported_once_per_silence() -> None:
    m, inst = model_with("m", registered_at=0.0, last_heartbeat=100.0)
    table = FakeTable([m])
    hb, reported = watcher(table, 20.0)
    assert hb.check(119.0) == []  # 19 s silent: not yet
    found = hb.check(121.0)
    assert found == reported
    assert [(u.model, u.instance, u.pid, u.committed, u.state) for u in found] == [
        ("m", "0", 4242, True, EngineState.RESIDENT)
    ]
    assert found[0].silent_seconds == pytest.approx(21.0)
    assert hb.check(150.0) == []  # the same silence: reported once
    inst.last_heartbeat = 151.0  # it beat again, then fell silent again
    assert hb.check(160.0) == []
    assert len(hb.check(172.0)) == 1
    assert len(reported) == 2


def test_a_client_that_keeps_beating_is_never_reported() -> None:
    """A process busy with a long request still beats (the library's own thread)."""
    m, inst = model_with("busy", registered_at=0.0, last_heartbeat=0.0)
    table = FakeTable([m])
    hb, reported = watcher(table, 20.0)
    for now in range(5, 300, 5):
        inst.last_heartbeat = float(now)
        hb.check(now + 4.9)
    assert reported == []


def test_a_client_stopped_before_its_first_heartbeat_is_reported_from_its_registration() -> None:
    m, _ = model_with("early", registered_at=50.0, last_heartbeat=None)
    hb, reported = watcher(FakeTable([m]), 20.0)
    assert hb.check(69.0) == []
    assert len(hb.check(71.0)) == 1
    assert reported[0].silent_seconds == pytest.approx(21.0)


def test_nothing_is_reported_with_the_deadline_off_or_for_a_closed_client() -> None:
    m, inst = model_with("m", registered_at=0.0, last_heartbeat=1.0, committed=False)
    hb, reported = watcher(FakeTable([m]), 0.0)
    assert hb.check(10_000.0) == []
    hb, reported = watcher(FakeTable([m]), 20.0)
    inst.peer.closed = True  # type: ignore[union-attr]
    assert hb.check(10_000.0) == []
    assert reported == []


def test_a_listener_that_fails_is_logged_and_the_watcher_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, _ = model_with("a", registered_at=0.0, last_heartbeat=0.0)
    b, _ = model_with("b", registered_at=0.0, last_heartbeat=0.0)
    hb = Heartbeats(FakeTable([a, b]), ledger=None, timeout_seconds=30.0,  # type: ignore[arg-type]
                    unresponsive_after_seconds=10.0)  # fmt: skip
    seen: list[str] = []

    def listener(u: Unresponsive) -> None:
        seen.append(u.model)
        raise RuntimeError("boom")

    hb.on_unresponsive(listener)
    assert len(hb.check(11.0)) == 2
    assert seen == ["a", "b"]
    assert "the unresponsive-client listener failed" in caplog.text


def test_the_watcher_looks_at_least_four_times_per_deadline() -> None:
    hb, _ = watcher(FakeTable(), 10.0)
    assert hb.period_seconds() == 2.5
    hb, _ = watcher(FakeTable(), 0.0)
    assert hb.period_seconds() == 5.0  # the 30 s log deadline, at most 5 s
