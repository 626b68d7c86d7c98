"""Faults: kill -9 of clients and of the agent, restart, readopt, restore from the host store.

Memory is checked independently of the engine's counters: `memfd:` mappings in the
clients' /proc/<pid>/maps and fstat of the memfds the agent holds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.engine_procs import (
    AgentProc,
    Background,
    ClientProc,
    Procs,
    memfd_fd_inodes,
    memfd_mappings,
    shm_procs,
)
from tests.support.waiting import wait_for

MIB = 1 << 20
REGIONS = [["w", 6 * MIB, "weights"], ["kv", 2 * MIB, "kv"]]


@pytest.fixture
def procs() -> Iterator[Procs]:
    with shm_procs("modelswap-faults-") as p:
        yield p


def loaded(
    procs: Procs, agent: AgentProc, model: str, seed: int
) -> tuple[ClientProc, dict[str, str]]:
    c = procs.client(agent, model)
    r = c.ok(cmd="attach", model=model, socket=agent.socket, regions=REGIONS)
    assert not r["restored"]
    hashes = {
        str(t): str(c.ok(cmd="fill", tag=t, seed=seed + i)["sha256"])
        for i, (t, _, _) in enumerate(REGIONS)
    }
    c.ok(cmd="commit")
    return c, hashes


def client_chunk_bytes(pid: int) -> int:
    return sum(end - start for start, end, _, _ in memfd_mappings(pid))


def assert_accounting(agent: AgentProc, clients: list[ClientProc]) -> None:
    """HBM accounting is exact: what clients map is what the engine and allocator charge."""
    assert agent.ok(cmd="pool_full")["full"]  # no refill in flight while we count
    gpu = agent.status()["gpus"][0]
    mapped = sum(client_chunk_bytes(c.pid) for c in clients if c.popen.poll() is None)
    assert gpu["budget_used_bytes"] == mapped
    assert gpu["allocator_used_bytes"] == mapped
    held = sum(memfd_fd_inodes(agent.pid).values())
    assert held <= gpu["capacity_bytes"]
    assert held == gpu["allocator_used_bytes"] + gpu["pooled_bytes"]


def restart(procs: Procs, old: AgentProc, models: list[str]) -> AgentProc:
    old.kill9()
    agent = procs.agent(["64M"], models, ["--grace", "5"])
    for p in procs.all:
        if isinstance(p, ClientProc) and p.popen.poll() is None:
            agent.ok(cmd="vouch", pid=p.pid, model=p.model)
    return agent


@pytest.mark.parametrize("state", ["resident", "swapped_out", "draining", "loading"])
def test_kill_client_in_each_state_frees_its_memory(procs: Procs, state: str) -> None:
    agent = procs.agent(["64M"], ["m:0:preserve"])
    if state == "loading":
        c = procs.client(agent, "m")
        c.ok(cmd="attach", model="m", socket=agent.socket, regions=REGIONS)
        hashes = None
    else:
        c, hashes = loaded(procs, agent, "m", 1)
    swap_out: Background | None = None
    if state == "swapped_out":
        agent.ok(cmd="swap_out", model="m")
    elif state == "draining":
        assert c.ok(cmd="hold")["held"]
        swap_out = Background(agent.call, cmd="swap_out", model="m")
        wait_for(lambda: agent_state(agent) == "Draining", what="draining")
    inodes = {ino for *_, ino in memfd_mappings(c.pid)}
    c.kill9()
    if swap_out is not None:
        swap_out.join(timeout=30)
    wait_for(lambda: agent.status()["gpus"][0]["budget_used_bytes"] == 0, what="chunks released")
    assert not inodes & set(memfd_fd_inodes(agent.pid))
    assert_accounting(agent, [])
    expected = "Loading" if state == "loading" else "SwappedOut"
    assert agent_state(agent) == expected
    # a new process of the same model: restored from the host store, never reloaded
    c2 = procs.client(agent, "m")
    r = c2.ok(cmd="attach", model="m", socket=agent.socket, regions=REGIONS)
    assert r["restored"] is (state != "loading")
    if hashes is not None:
        assert c2.ok(cmd="hash", tag="w")["sha256"] == hashes["w"]
        if state == "swapped_out":  # preserved KV was saved at swap-out
            assert c2.ok(cmd="hash", tag="kv")["sha256"] == hashes["kv"]


def agent_state(agent: AgentProc, model: str = "m") -> str:
    state: str = agent.status()["models"][model]["state"]
    return state


def readopted_intact(
    procs: Procs, agent: AgentProc, clients: dict[str, tuple[ClientProc, dict[str, str]]]
) -> None:
    """Every client reconnected and readopted; states settled; bytes and HBM exact."""
    # registering is not readopting: wait for the engine to say every instance is back
    wait_for(lambda: not agent.status()["recovering"], what="recovery over")
    wait_for(
        lambda: all(
            s["state"] in ("Resident", "SwappedOut") for s in agent.status()["models"].values()
        ),
        what="settled",
    )
    wait_for(
        lambda: sum(s["instances"] for s in agent.status()["models"].values()) == len(clients),
        what="every client reconnected",
    )
    live = [c for c, _ in clients.values()]
    assert_accounting(agent, live)
    for c, hashes in clients.values():
        for tag, digest in hashes.items():
            assert c.ok(cmd="hash", tag=tag)["sha256"] == digest, tag
    assert_accounting(agent, live)
    assert not list((procs.workdir / "store").rglob("*.tmp"))


@pytest.mark.parametrize("when", ["resident", "swapped_out", "draining"])
def test_agent_killed_alone_clients_readopt(procs: Procs, when: str) -> None:
    models = ["a:0:preserve", "b:0:preserve"]
    agent = procs.agent(["64M"], models)
    ca, ha = loaded(procs, agent, "a", 1)
    cb, hb = loaded(procs, agent, "b", 50)
    if when == "swapped_out":
        agent.ok(cmd="swap_out", model="b")
    elif when == "draining":
        assert cb.ok(cmd="hold")["held"]  # the swap-out of b drains until released
        Background(agent.call, cmd="swap_out", model="b")
        wait_for(lambda: cb.ok(cmd="state")["state"] == "draining", what="draining")
    agent = restart(procs, agent, models)
    if when == "draining":
        cb.ok(cmd="release")
    readopted_intact(procs, agent, {"a": (ca, ha), "b": (cb, hb)})
    # readopted: the resident model was not copied again
    assert agent.status()["models"]["a"]["state"] == "Resident"
    assert agent.status()["models"]["a"]["swap_ins"] == 0
    agent.ok(cmd="swap_out", model="a")
    assert memfd_mappings(ca.pid) == []
    assert_accounting(agent, [ca, cb])


@pytest.mark.parametrize(
    "checkpoint",
    [
        "swap_out.quiesced",
        "swap_out.kv_saved",
        "swap_out.unmapped",
        "swap_in.allocated",
        "swap_in.mapped",
    ],
)
def test_agent_killed_mid_swap_clients_readopt(procs: Procs, checkpoint: str) -> None:
    """The agent stops exactly at `checkpoint` (no timing) and is killed there."""
    models = ["a:0:preserve", "b:0:preserve"]
    agent = procs.agent(["64M"], models, ["--pause-at", checkpoint])
    ca, ha = loaded(procs, agent, "a", 1)
    cb, hb = loaded(procs, agent, "b", 50)
    if checkpoint.startswith("swap_out"):
        op = Background(agent.call, cmd="swap_out", model="b")
    else:
        agent.ok(cmd="swap_out", model="b")
        op = Background(cb.call, cmd="hash", tag="w")  # in_use() asks for the swap-in
    agent.wait_paused(checkpoint)
    agent = restart(procs, agent, models)
    if checkpoint.startswith("swap_in"):
        # the client rolled its half-done swap-in back and asked the new agent again
        assert op.join()["sha256"] == hb["w"]
    readopted_intact(procs, agent, {"a": (ca, ha), "b": (cb, hb)})
    assert agent.status()["models"]["a"]["swap_ins"] == 0


@pytest.mark.parametrize("checkpoint", ["commit.saved", "commit.renamed"])
def test_agent_killed_during_host_store_write_loses_nothing(procs: Procs, checkpoint: str) -> None:
    models = ["m:0:preserve"]
    agent = procs.agent(["64M"], models, ["--pause-at", checkpoint])
    c = procs.client(agent, "m")
    c.ok(cmd="attach", model="m", socket=agent.socket, regions=REGIONS)
    h = c.ok(cmd="fill", tag="w", seed=9)["sha256"]
    commit = Background(c.call, cmd="commit")
    agent.wait_paused(checkpoint)  # the weight file is written (and renamed, for the 2nd)
    agent = restart(procs, agent, models)
    # the client's commit survives the agent: it is retried against the new agent
    assert commit.join()["ok"] is True
    assert agent_state(agent) == "Resident"
    store = procs.workdir / "store"
    assert not list(store.rglob("*.tmp"))
    # exactly one weight copy and one accounting of it: nothing orphaned by the crash
    weights = list(store.rglob("*.weights"))
    assert len(weights) == 1
    assert agent.status()["gpus"][0]["host_store_bytes"] == weights[0].stat().st_size
    agent.ok(cmd="swap_out", model="m")
    assert c.ok(cmd="hash", tag="w")["sha256"] == h
    assert_accounting(agent, [c])


def test_copy_renamed_but_never_recorded_is_removed_at_restart(procs: Procs) -> None:
    """Agent and client die between a weight file's rename and the state file's rewrite."""
    agent = procs.agent(["64M"], ["m:0"], ["--pause-at", "commit.renamed"])
    c = procs.client(agent, "m")
    c.ok(cmd="attach", model="m", socket=agent.socket, regions=REGIONS)
    Background(c.call, cmd="commit")
    agent.wait_paused("commit.renamed")
    store = procs.workdir / "store"
    assert len(list(store.rglob("*.weights"))) == 1
    agent.kill9()
    c.kill9()
    agent = procs.agent(["64M"], ["m:0"], ["--grace", "0.5"])
    wait_for(lambda: agent_state(agent) == "Loading", what="recovered")
    # the file no state names is gone, not left unaccounted in host memory
    assert list(store.rglob("*.weights")) == []
    assert agent.status()["gpus"][0]["host_store_bytes"] == 0


def test_agent_and_clients_killed_restore_from_host_store(procs: Procs) -> None:
    models = ["a:0:preserve", "b:0:preserve"]
    agent = procs.agent(["64M"], models)
    ca, ha = loaded(procs, agent, "a", 1)
    cb, hb = loaded(procs, agent, "b", 2)
    agent.ok(cmd="swap_out", model="b")  # b's KV is in the host store, a's only in HBM
    agent.kill9()
    ca.kill9()
    cb.kill9()
    agent = procs.agent(["64M"], models, ["--grace", "0.5"])
    wait_for(
        lambda: all(s["state"] == "SwappedOut" for s in agent.status()["models"].values()),
        what="recovered",
    )
    assert_accounting(agent, [])
    for name, hashes, kv_kept in (("a", ha, False), ("b", hb, True)):
        c = procs.client(agent, name)
        r = c.ok(cmd="attach", model=name, socket=agent.socket, regions=REGIONS)
        assert r["restored"] is True
        assert c.ok(cmd="hash", tag="w")["sha256"] == hashes["w"]
        assert (c.ok(cmd="hash", tag="kv")["sha256"] == hashes["kv"]) is kv_kept


def test_swap_out_right_after_an_agent_restart_waits_for_readopt(procs: Procs) -> None:
    """A swap-out requested before the clients readopted must not "succeed" unmapping
    nothing: it waits for them, then really unmaps (seen in the client's own maps)."""
    models = ["m:0:preserve"]
    agent = procs.agent(["64M"], models)
    c, hashes = loaded(procs, agent, "m", 3)
    mapped = memfd_mappings(c.pid)
    assert mapped
    agent.kill9()
    # not vouched yet: the client cannot readopt until the test lets it
    agent = procs.agent(["64M"], models, ["--grace", "30"])
    assert agent.status()["recovering"] is True
    swap_out = Background(agent.call, cmd="swap_out", model="m")
    wait_for(lambda: agent.status()["recovery_waiters"] == 1, what="the swap-out waiting")
    assert memfd_mappings(c.pid) == mapped  # nothing touched while it waits
    agent.ok(cmd="vouch", pid=c.pid, model="m")  # the client reconnects and readopts
    assert swap_out.join(timeout=30)["ok"] is True
    assert memfd_mappings(c.pid) == []
    assert c.ok(cmd="state")["state"] == "swapped_out"
    assert agent_state(agent) == "SwappedOut"
    assert agent.status()["models"]["m"]["swap_outs"] == 1
    assert_accounting(agent, [c])
    assert c.ok(cmd="hash", tag="w")["sha256"] == hashes["w"]
    assert c.ok(cmd="hash", tag="kv")["sha256"] == hashes["kv"]  # preserved at swap-out
