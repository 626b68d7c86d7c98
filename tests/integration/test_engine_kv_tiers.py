"""The tiered KV pool through `attach`: the policy comes from the agent, the host tier is
an agent-owned host-store file, and the HBM budget does not grow with sequence length."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.engine_procs import Procs, mappings, memfd_mappings, open_files, shm_procs

MIB = 1 << 20
KIB = 1 << 10
BLOCK = 64 * KIB  # 16 tokens per block; the 2 MiB KV region holds 32 HBM blocks
REGIONS = [["w", 4 * MIB, "weights"], ["kv", 2 * MIB, "kv"]]


@pytest.fixture
def procs() -> Iterator[Procs]:
    with shm_procs("modelswap-kv-") as p:
        yield p


def inside(address: int, ranges: list[tuple[int, int]]) -> bool:
    return any(start <= address and address + BLOCK <= end for start, end in ranges)


def test_long_sequences_land_in_the_host_tier_and_the_hbm_budget_holds(procs: Procs) -> None:
    # offloadAfterTokens 64 (4 blocks), hostBytes 256 KiB (4 blocks)
    agent = procs.agent(["64M"], ["m:0"], ["--kv-tier", "m:64:256K"])
    c = procs.client(agent, "m")
    c.ok(cmd="attach", model="m", socket=agent.socket, regions=REGIONS)
    c.ok(cmd="fill", tag="w", seed=1)
    c.ok(cmd="commit")
    c.ok(cmd="kv_pool", tag="kv", block_bytes=BLOCK, tokens_per_block=16)
    gpu = agent.status()["gpus"][0]
    hbm_used = gpu["budget_used_bytes"]
    assert hbm_used == 6 * MIB
    # the host tier is a host-store file, charged to this GPU's host-store capacity
    tiers = list((procs.workdir / "store").rglob("*.kvhost"))
    assert len(tiers) == 1 and tiers[0].stat().st_size == 256 * KIB
    assert gpu["host_store_bytes"] == 4 * MIB + 256 * KIB
    # the client maps it (writable: it is KV, not a weight copy) and keeps no fd of it
    host_ranges = [(s, e) for s, e, perms, path in mappings(c.pid) if path == str(tiers[0])]
    assert host_ranges and all(
        perms == "rw-s" for _, _, perms, path in mappings(c.pid) if path == str(tiers[0])
    )
    assert not [t for _, t, _ in open_files(c.pid) if t == str(tiers[0])]
    hbm_ranges = [(s, e) for s, e, _, _ in memfd_mappings(c.pid)]

    short = c.ok(cmd="kv_append", seq="short", tokens=40)
    assert [t for t, _ in short["added"]] == ["hbm"] * 3
    long = c.ok(cmd="kv_append", seq="long", tokens=128)  # 8 blocks: 4 in HBM, 4 on host
    assert [t for t, _ in long["added"]] == ["hbm"] * 4 + ["host"] * 4
    assert all(inside(a, hbm_ranges) for t, a in long["added"] if t == "hbm")
    assert all(inside(a, host_ranges) for t, a in long["added"] if t == "host")
    assert long["host_free"] == 0
    # the HBM budget holds: the long sequence took no HBM beyond the KV region
    assert agent.status()["gpus"][0]["budget_used_bytes"] == hbm_used

    # hostBytes caps the host tier; the least recently used sequence loses its host blocks
    newer = c.ok(cmd="kv_append", seq="newer", tokens=96)  # 4 HBM + 2 host blocks
    assert [t for t, _ in newer["added"]] == ["hbm"] * 4 + ["host"] * 2
    assert newer["evicted"] == ["long"]
    c.ok(cmd="kv_free", seq="newer")
    again = c.ok(cmd="kv_append", seq="long", tokens=1)
    assert [t for t, _ in again["blocks"]][:4] == ["hbm"] * 4  # its HBM blocks stayed
    assert agent.status()["gpus"][0]["budget_used_bytes"] == hbm_used

    # the tier outlives a swap cycle: same file, same mapping, never copied
    agent.ok(cmd="swap_out", model="m")
    assert [(s, e) for s, e, _, p in mappings(c.pid) if p == str(tiers[0])] == host_ranges
    c.ok(cmd="hash", tag="w")
    assert list((procs.workdir / "store").rglob("*.kvhost")) == tiers


def test_host_tier_that_does_not_fit_the_host_store_is_refused(procs: Procs) -> None:
    agent = procs.agent(["64M"], ["m:0"], ["--kv-tier", "m:64:8M", "--store-bytes", "4M"])
    c = procs.client(agent, "m")
    r = c.call(cmd="attach", model="m", socket=agent.socket, regions=REGIONS)
    assert r["ok"] is False and r["code"] == "HostStoreFull"
    assert memfd_mappings(c.pid) == []
    assert agent.status()["gpus"][0]["host_store_bytes"] == 0
    assert agent.status()["gpus"][0]["budget_used_bytes"] == 0
