"""Per-process overhead in the HBM budget (measured by the allocator, else estimated) and
client heartbeats (recorded, logged when missing, nothing else)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tests.support.engine_procs import AgentProc, Procs, shm_procs
from tests.support.waiting import wait_for

MIB = 1 << 20


@pytest.fixture
def procs() -> Iterator[Procs]:
    with shm_procs("modelswap-overhead-") as p:
        yield p


def gpu0(agent: AgentProc) -> dict[str, int]:
    status: dict[str, int] = agent.status()["gpus"][0]
    return status


@pytest.mark.parametrize("measured", [True, False])
def test_budget_subtracts_each_process_overhead(procs: Procs, measured: bool) -> None:
    # the allocator "measures" 6 MiB per process; without a measurement the engine's
    # configured estimate (4 MiB) applies
    extra = ["--overhead-estimate", "4M"] + (["--sim-overhead", "6M"] if measured else [])
    per_process = 6 * MIB if measured else 4 * MIB
    agent = procs.agent(["32M"], ["a:0", "b:0"], extra)
    assert gpu0(agent)["budget_bytes"] == 32 * MIB
    a = procs.client(agent, "a")
    a.ok(cmd="attach", model="a", socket=agent.socket, regions=[["w", 8 * MIB, "weights"]])
    assert gpu0(agent)["overhead_bytes"] == per_process
    assert gpu0(agent)["budget_bytes"] == 32 * MIB - per_process
    # a second process: its overhead too; a model that fits the GPU but not the budget
    # left after both processes' overhead is refused with a reason
    b = procs.client(agent, "b")
    big = 32 * MIB - 2 * per_process - 8 * MIB + 2 * MIB
    r = b.call(cmd="attach", model="b", socket=agent.socket, regions=[["w", big, "weights"]])
    assert r["ok"] is False and r["code"] == "NoCapacity"
    assert gpu0(agent)["budget_used_bytes"] == 8 * MIB
    b.kill9()  # a process that is gone no longer costs overhead
    wait_for(lambda: gpu0(agent)["processes"] == 1, what="b detached")
    assert gpu0(agent)["budget_bytes"] == 32 * MIB - per_process


def test_heartbeats_are_recorded_and_a_silent_client_is_only_logged(
    procs: Procs, capfd: pytest.CaptureFixture[str]
) -> None:
    agent = procs.agent(["32M"], ["m:0"], ["--heartbeat-timeout", "0.3"])
    c = procs.client(agent, "m")
    c.ok(
        cmd="attach",
        model="m",
        socket=agent.socket,
        regions=[["w", 4 * MIB, "weights"]],
        heartbeat=0.05,
    )
    c.ok(cmd="commit")

    def age() -> float | None:
        ages = agent.status()["models"]["m"]["last_heartbeat_ages_seconds"]
        value: float | None = ages["0"]
        return value

    wait_for(lambda: age() is not None, what="a heartbeat")
    os.kill(c.pid, signal.SIGSTOP)  # silent, but its socket stays open
    try:
        wait_for(lambda: (age() or 0.0) > 0.6, what="heartbeats missed")
        m = agent.status()["models"]["m"]
        assert m["state"] == "Resident" and m["instances"] == 1  # no behaviour change
        wait_for(lambda: "no heartbeat for" in capfd.readouterr().err, what="the log line")
    finally:
        os.kill(c.pid, signal.SIGCONT)
    wait_for(lambda: (age() or 1.0) < 0.3, what="heartbeats again")
    assert agent.status()["models"]["m"]["state"] == "Resident"
