"""The memory engine with real processes: an agent and model processes over the socket.

Models are a few MiB; the HBM budget is small enough that they compete for it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

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


@pytest.fixture
def procs() -> Iterator[Procs]:
    with shm_procs("modelswap-engine-") as p:
        yield p


def load(  # noqa: PLR0917 - a test helper read positionally
    c: ClientProc,
    agent: AgentProc,
    model: str,
    regions: list[list[object]],
    seed: int,
    instance: str = "0",
) -> dict[str, str]:
    """Attach, fill every region with seeded random bytes, commit; returns their sha256."""
    r = c.ok(cmd="attach", model=model, instance=instance, socket=agent.socket, regions=regions)
    assert r["restored"] is False
    hashes = {
        str(t): c.ok(cmd="fill", tag=t, seed=seed + i)["sha256"]
        for i, (t, _, _) in enumerate(regions)
    }
    c.ok(cmd="commit")
    return hashes


def test_swap_cycles_keep_bytes_exact_across_models_and_gpus(procs: Procs) -> None:
    # 4 models of 6 MiB + 2 MiB KV on 2 sim GPUs whose budget holds only two each
    agent = procs.agent(["18M", "18M"], ["a:0:preserve", "b:0:preserve", "c:1", "d:1:preserve"])
    names = ["a", "b", "c", "d"]
    clients: dict[str, ClientProc] = {}
    hashes: dict[str, dict[str, str]] = {}
    for i, name in enumerate(names):
        c = clients[name] = procs.client(agent, name)
        hashes[name] = load(
            c, agent, name, [["w", 6 * MIB, "weights"], ["kv", 2 * MIB, "kv"]], seed=100 * i
        )
    rng = random.Random(4)
    for _ in range(60):
        name = rng.choice(names)
        if rng.random() < 0.5:
            agent.ok(cmd="swap_out", model=name)
            state = clients[name].ok(cmd="state")
            assert state["state"] == "swapped_out"
            assert memfd_mappings(clients[name].pid) == []
        else:
            tag = rng.choice(["w", "kv"])
            got = clients[name].ok(cmd="hash", tag=tag)["sha256"]  # swaps in (evicting)
            if tag == "kv" and name == "c":  # discard: KV is fresh after a swap-out
                continue
            assert got == hashes[name][tag], (name, tag)
        status = agent.status()
        for gpu in status["gpus"]:
            assert gpu["budget_used_bytes"] <= gpu["budget_bytes"]
            assert gpu["allocator_used_bytes"] == gpu["budget_used_bytes"]
            assert gpu["allocator_used_bytes"] + gpu["pooled_bytes"] <= gpu["capacity_bytes"]
    for name in names:
        assert clients[name].ok(cmd="hash", tag="w")["sha256"] == hashes[name]["w"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_thousand_randomized_swap_cycles(procs: Procs) -> None:
    agent = procs.agent(
        ["12M", "12M"], ["a:0:preserve", "b:0:preserve", "c:1:preserve", "d:1:preserve"]
    )
    names = ["a", "b", "c", "d"]
    clients = {n: procs.client(agent, n) for n in names}
    hashes = {
        n: load(clients[n], agent, n, [["w", 4 * MIB, "weights"], ["kv", 2 * MIB, "kv"]], 7 * i)
        for i, n in enumerate(names)
    }
    rng = random.Random(1000)
    cycles = 0
    while cycles < 1000:
        name = rng.choice(names)
        status = agent.status()["models"][name]
        if status["state"] == "Resident":
            agent.ok(cmd="swap_out", model=name)
            continue
        tag = rng.choice(["w", "kv"])
        assert clients[name].ok(cmd="hash", tag=tag)["sha256"] == hashes[name][tag]
        cycles += 1
    swaps = sum(s["swap_ins"] for s in agent.status()["models"].values())
    assert swaps >= 1000


def test_address_is_stable_and_stray_read_faults(procs: Procs) -> None:
    agent = procs.agent(["64M"], ["m:0"])
    c = procs.client(agent, "m")
    r = c.ok(cmd="attach", model="m", socket=agent.socket, regions=[["w", 5 * MIB, "weights"]])
    address = r["addresses"]["w"]
    h = c.ok(cmd="fill", tag="w", seed=3)["sha256"]
    c.ok(cmd="commit")
    agent.ok(cmd="swap_out", model="m")
    assert c.ok(cmd="stray_read", address=address)["signal"] == 11  # SIGSEGV
    assert c.ok(cmd="hash", tag="w")["sha256"] == h  # in_use() swaps it in
    assert c.ok(cmd="raw_hash", tag="w", address=address)["sha256"] == h
    assert agent.status()["models"]["m"]["swap_ins"] == 1


def test_swap_out_waits_for_in_use(procs: Procs) -> None:
    agent = procs.agent(["64M"], ["m:0"])
    c = procs.client(agent, "m")
    load(c, agent, "m", [["w", 4 * MIB, "weights"]], seed=5)
    assert c.ok(cmd="hold")["held"]
    result: dict[str, object] = {}
    t = threading.Thread(target=lambda: result.update(agent.call(cmd="swap_out", model="m")))
    t.start()
    # the swap-out is draining, not done, while the work is in progress
    wait_for(lambda: c.ok(cmd="state")["state"] == "draining", what="draining")
    assert t.is_alive()
    c.ok(cmd="release")
    t.join(timeout=30)
    assert result.get("ok") is True
    assert c.ok(cmd="state")["state"] == "swapped_out"


def test_two_instances_are_quiesced_together(procs: Procs) -> None:
    agent = procs.agent(["64M"], ["m:0:preserve"])
    c0, c1 = procs.client(agent, "m"), procs.client(agent, "m")
    h0 = load(c0, agent, "m", [["w", 4 * MIB, "weights"], ["kv", 2 * MIB, "kv"]], 1, "0")
    h1 = load(c1, agent, "m", [["w", 4 * MIB, "weights"], ["kv", 2 * MIB, "kv"]], 9, "1")
    agent.ok(cmd="swap_out", model="m")
    for c in (c0, c1):
        assert c.ok(cmd="state")["state"] == "swapped_out"
        assert memfd_mappings(c.pid) == []
    assert c1.ok(cmd="hash", tag="kv")["sha256"] == h1["kv"]  # swaps both in
    assert c0.ok(cmd="state")["state"] == "resident"
    assert c0.ok(cmd="hash", tag="w")["sha256"] == h0["w"]
    assert c0.ok(cmd="hash", tag="kv")["sha256"] == h0["kv"]


def test_discard_kv_is_reported(procs: Procs) -> None:
    agent = procs.agent(["64M"], ["m:0:discard"])
    c = procs.client(agent, "m")
    h = load(c, agent, "m", [["w", 4 * MIB, "weights"], ["kv", 2 * MIB, "kv"]], 1)
    agent.ok(cmd="swap_out", model="m")
    assert c.ok(cmd="state")["kv_discarded"] is True
    assert agent.status()["models"]["m"]["kv_discarded"] is True
    assert c.ok(cmd="hash", tag="w")["sha256"] == h["w"]
    assert c.ok(cmd="hash", tag="kv")["sha256"] != h["kv"]


def test_client_naming_another_model_is_refused_and_gets_no_fd(procs: Procs) -> None:
    agent = procs.agent(["64M"], ["a:0", "b:0"])
    owner = procs.client(agent, "a")
    load(owner, agent, "a", [["w", 4 * MIB, "weights"]], 1)
    intruder = procs.client(agent, "b")  # vouched for b only
    r = intruder.call(
        cmd="attach", model="a", socket=agent.socket, regions=[["w", 4 * MIB, "weights"]]
    )
    assert r["ok"] is False and r["code"] == "NotVouched"
    assert memfd_mappings(intruder.pid) == []
    store = str(procs.workdir / "store")
    assert not [t for _, t, _ in open_files(intruder.pid) if t.startswith(("/memfd:", store))]


def test_weight_copies_are_never_writable_in_clients(procs: Procs) -> None:
    agent = procs.agent(["64M"], ["m:0"])
    c = procs.client(agent, "m")
    h = load(c, agent, "m", [["w", 4 * MIB, "weights"]], 1)
    store = str(procs.workdir / "store")
    for _ in range(3):
        agent.ok(cmd="swap_out", model="m")
        assert c.ok(cmd="hash", tag="w")["sha256"] == h["w"]
        for _, target, flags in open_files(c.pid):
            if target.startswith(store):
                assert flags & 0o3 == 0, f"writable fd on {target}"
        assert all("w" not in perms for perms, _ in file_mappings(c.pid, store))
    weights = list((procs.workdir / "store").rglob("*.weights"))
    assert weights and all(p.stat().st_mode & 0o777 == 0o600 for p in weights)
    assert (procs.workdir / "store").stat().st_mode & 0o777 == 0o700


def test_budget_refuses_a_model_that_cannot_fit(procs: Procs) -> None:
    agent = procs.agent(["32M"], ["big:0", "pinned:0"])
    c = procs.client(agent, "big")
    r = c.call(cmd="attach", model="big", socket=agent.socket, regions=[["w", 40 * MIB, "weights"]])
    assert r["ok"] is False and r["code"] == "NoCapacity"
    assert agent.status()["gpus"][0]["budget_used_bytes"] == 0


def test_released_chunks_leave_the_agent_and_inodes_are_never_reused(procs: Procs) -> None:
    agent = procs.agent(["64M"], ["m:0"])
    c = procs.client(agent, "m")
    load(c, agent, "m", [["w", 4 * MIB, "weights"]], 1)
    seen: set[int] = set()
    fds_before: tuple[int, ...] | None = None
    for cycle in range(4):
        # no fd leaks on either side: every cycle ends with the same open fds (sockets
        # aside: the test's control connections come and go)
        assert agent.ok(cmd="pool_full")["full"]
        fds = tuple(
            len([t for _, t, _ in open_files(pid) if not t.startswith("socket:")])
            for pid in (agent.pid, c.pid)
        )
        if cycle == 1:  # after one full cycle (the weight copy's mapping is kept)
            fds_before = fds
        elif fds_before is not None:
            assert fds == fds_before
        inodes = {ino for _, _, _, ino in memfd_mappings(c.pid)}
        assert inodes and not inodes & seen  # a fresh chunk on every swap-in
        seen |= inodes
        agent.ok(cmd="swap_out", model="m")
        assert memfd_mappings(c.pid) == []
        assert not inodes & set(memfd_fd_inodes(agent.pid))  # the agent closed them
        c.ok(cmd="hash", tag="w")


def test_a_paced_swap_in_is_reported_as_scaled(procs: Procs) -> None:
    """A client whose sim mapper paces copies to an emulated 1 GB/s link: the swap-in's
    bandwidth metadata says scaled, with that target, and its rate stays at or below it
    (the pacer sleeps at least each copy's slot, so this holds on any machine)."""
    agent = procs.agent(["64M"], ["paced:0", "plain:0"])
    rate: dict[str, dict[str, object]] = {}
    for name, pace in (("paced", 1.0), ("plain", 0.0)):
        c = procs.client(agent, name)
        r = c.ok(
            cmd="attach",
            model=name,
            socket=agent.socket,
            regions=[["w", 8 * MIB, "weights"], ["kv", 2 * MIB, "kv"]],
            pace_gbps=pace,
        )
        assert r["restored"] is False
        h = c.ok(cmd="fill", tag="w", seed=11)["sha256"]
        c.ok(cmd="commit")
        agent.ok(cmd="swap_out", model=name)
        agent.ok(cmd="swap_in", model=name)
        assert c.ok(cmd="hash", tag="w")["sha256"] == h
        rate[name] = agent.status()["models"][name]["last_swap_in_copy"]
    paced, plain = rate["paced"], rate["plain"]
    assert paced["scaled"] is True and paced["target_bytes_per_second"] == 1e9
    assert paced["bytes"] == 8 * MIB  # the weights; discarded KV comes back fresh
    assert 0 < float(paced["bytes_per_second"]) <= 1e9  # type: ignore[arg-type]
    assert plain["scaled"] is False and plain["target_bytes_per_second"] is None
    assert plain["bytes"] == 8 * MIB


def test_the_nodes_pace_paces_a_model_that_sets_none(procs: Procs) -> None:
    """The agent's per-GPU pace (`gpus[].paceGBps`) reaches a client whose own mapper is
    unpaced through its registration reply: a swap-in of N bytes there takes at least
    N / pace and is reported scaled; the unpaced GPU's model is not slowed."""
    agent = procs.agent(["64M", "64M"], ["paced:0", "plain:1"], ["--pace-gbps", "0:0.5"])
    size = 16 * MIB
    for name in ("paced", "plain"):
        c = procs.client(agent, name)
        r = c.ok(cmd="attach", model=name, socket=agent.socket, regions=[["w", size, "weights"]])
        assert r["restored"] is False
        h = c.ok(cmd="fill", tag="w", seed=5)["sha256"]
        c.ok(cmd="commit")
        agent.ok(cmd="swap_out", model=name)
        started = time.monotonic()
        agent.ok(cmd="swap_in", model=name)
        took = time.monotonic() - started
        copy = agent.status()["models"][name]["last_swap_in_copy"]
        assert c.ok(cmd="hash", tag="w")["sha256"] == h
        if name == "paced":
            assert took >= size / 0.5e9  # the emulated link's time for every byte
            assert copy["scaled"] is True and copy["target_bytes_per_second"] == 0.5e9
            assert 0 < float(copy["bytes_per_second"]) <= 0.5e9
        else:
            assert copy["scaled"] is False and copy["target_bytes_per_second"] is None
