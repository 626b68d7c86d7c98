"""Model lifecycle beyond swapping: drop mode, FAILED, and removal, with real processes.

Memory freed is checked independently of the engine's counters: `memfd:` and host-store
mappings in the client's /proc/<pid>/maps, fds it holds, fstat of the agent's memfds, and
the host-store folder itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engine_procs import (
    AgentProc,
    ClientProc,
    Procs,
    file_mappings,
    memfd_fd_inodes,
    memfd_mappings,
    open_files,
    shm_procs,
)
from tests.support.waiting import wait_for

MIB = 1 << 20
REGIONS = [["w", 4 * MIB, "weights"], ["kv", 2 * MIB, "kv"]]


@pytest.fixture
def procs() -> Iterator[Procs]:
    with shm_procs("modelswap-lifecycle-") as p:
        yield p


def loaded(procs: Procs, agent: AgentProc, model: str, seed: int) -> tuple[ClientProc, str]:
    c = procs.client(agent, model)
    assert not c.ok(cmd="attach", model=model, socket=agent.socket, regions=REGIONS)["restored"]
    digest = str(c.ok(cmd="fill", tag="w", seed=seed)["sha256"])
    c.ok(cmd="commit")
    return c, digest


def model_files(procs: Procs, model: str) -> list[Path]:
    return [p for p in (procs.workdir / "store").glob(f"gpu*/{model}/**/*") if p.is_file()]


def holds_nothing(procs: Procs, agent: AgentProc, c: ClientProc, inodes: set[int]) -> None:
    """The client maps no chunk and no host copy, holds no store fd; the agent no chunk."""
    store = str(procs.workdir / "store")
    assert memfd_mappings(c.pid) == []
    assert file_mappings(c.pid, store) == []
    assert not [t for _, t, _ in open_files(c.pid) if t.startswith(("/memfd:", store))]
    assert not inodes & set(memfd_fd_inodes(agent.pid))


def chunk_inodes(c: ClientProc) -> set[int]:
    return {ino for *_, ino in memfd_mappings(c.pid)}


def test_drop_mode_discards_the_host_copy_and_reloads_fresh(procs: Procs) -> None:
    agent = procs.agent(["64M"], ["m:0:preserve:drop"])
    c, digest = loaded(procs, agent, "m", 3)
    assert model_files(procs, "m")  # the weight copy exists while resident (crash safety)
    inodes = chunk_inodes(c)
    agent.ok(cmd="swap_out", model="m")
    status = agent.status()
    assert status["models"]["m"]["state"] == "Dropped"
    assert status["gpus"][0]["budget_used_bytes"] == 0
    assert status["gpus"][0]["host_store_bytes"] == 0
    assert model_files(procs, "m") == []
    holds_nothing(procs, agent, c, inodes)
    assert c.ok(cmd="state")["dropped"] is True
    # in_use() brings it back as fresh memory at the same addresses: the runtime reloads
    assert c.ok(cmd="hash", tag="w")["sha256"] != digest
    state = c.ok(cmd="state")
    assert state["state"] == "resident" and state["restored"] is False
    assert agent.status()["models"]["m"]["state"] == "Loading"
    assert c.ok(cmd="fill", tag="w", seed=3)["sha256"] == digest
    c.ok(cmd="commit")
    assert agent.status()["models"]["m"]["state"] == "Resident"


def test_lost_host_copy_fails_the_model_with_a_reason_and_frees_it(procs: Procs) -> None:
    agent = procs.agent(["64M"], ["m:0:preserve"])
    c, digest = loaded(procs, agent, "m", 5)
    agent.ok(cmd="swap_out", model="m")
    assert c.ok(cmd="hash", tag="w")["sha256"] == digest  # maps the weight copy (kept)
    agent.ok(cmd="swap_out", model="m")
    for p in model_files(procs, "m"):
        if p.suffix == ".weights":
            p.unlink()  # the only complete copy of the weights is gone
    r = c.call(cmd="hash", tag="w")
    assert r["ok"] is False and r["code"] == "ModelFailed"
    status = agent.status()
    assert status["models"]["m"]["state"] == "Failed"
    assert ".weights" in status["models"]["m"]["reason"]
    assert status["gpus"][0]["budget_used_bytes"] == 0
    assert status["gpus"][0]["host_store_bytes"] == 0
    assert model_files(procs, "m") == []  # the KV copy went with it
    holds_nothing(procs, agent, c, set())
    # FAILED is not the end: the next in_use() reloads it fresh from the source
    assert c.ok(cmd="hash", tag="w")["sha256"] != digest
    assert agent.status()["models"]["m"]["state"] == "Loading"


@pytest.mark.parametrize("state", ["resident", "swapped_out"])
def test_remove_model_frees_everything_and_tells_its_clients(procs: Procs, state: str) -> None:
    agent = procs.agent(["64M"], ["a:0:preserve", "b:0:preserve"])
    ca, _ = loaded(procs, agent, "a", 1)
    cb, digest_b = loaded(procs, agent, "b", 2)
    ca.ok(cmd="hash", tag="w")  # a's host mapping of its weight copy is cached now
    inodes = chunk_inodes(ca)
    if state == "swapped_out":
        agent.ok(cmd="swap_out", model="a")
    agent.ok(cmd="remove", model="a")
    status = agent.status()
    assert "a" not in status["models"]
    assert model_files(procs, "a") == []
    assert status["gpus"][0]["host_store_bytes"] == sum(
        p.stat().st_size for p in model_files(procs, "b")
    )
    assert ca.ok(cmd="state")["state"] == "removed"
    holds_nothing(procs, agent, ca, inodes)
    r = ca.call(cmd="hash", tag="w")
    assert r["ok"] is False and r["code"] == "Removed"
    # the other model is untouched and the HBM accounting is exact
    assert agent.ok(cmd="pool_full")["full"]
    gpu = agent.status()["gpus"][0]
    mapped = sum(end - start for start, end, _, _ in memfd_mappings(cb.pid))
    assert gpu["budget_used_bytes"] == gpu["allocator_used_bytes"] == mapped > 0
    assert cb.ok(cmd="hash", tag="w")["sha256"] == digest_b
    r = agent.call(cmd="swap_in", model="a")
    assert r["ok"] is False and r["code"] == "NotFound"


def test_removal_interrupted_by_a_crash_finishes_at_restart(procs: Procs) -> None:
    agent = procs.agent(["64M"], ["a:0:preserve"])
    ca, _ = loaded(procs, agent, "a", 1)
    agent.ok(cmd="swap_out", model="a")
    ca.kill9()
    # a state file that says DELETING, as a crash mid-removal leaves it
    state_file = procs.workdir / "store" / "state.json"
    wait_for(lambda: '"SwappedOut"' in state_file.read_text(), what="state written")
    agent.kill9()
    state_file.write_text(state_file.read_text().replace('"SwappedOut"', '"Deleting"'))
    agent = procs.agent(["64M"], [])
    assert agent.status()["models"] == {}
    assert model_files(procs, "a") == []
    assert agent.status()["gpus"][0]["host_store_bytes"] == 0
