"""The planner loop keeps SwapNodes to their nodes' Leases (issue 27, item 6), over the
in-memory stand-ins of test_operator_loop: a live node whose SwapNode was deleted keeps
its models; a lost node's SwapNode is labelled Expired, then deleted after the dead-node
retention, not before; a refused label or delete is logged once and the turn goes on."""

from __future__ import annotations

import dataclasses
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from modelswap_api import kube
from modelswap_operator.cache import Cache
from modelswap_operator.reconciler import Reconciler
from modelswap_operator.swapnode_keeping import LEASE_LABEL
from tests.unit.test_operator_loop import FakeAgents, FakeKube, deployment, reconciler_over

START = datetime(2026, 11, 27, 15, 0, tzinfo=UTC).timestamp()
GRACE_SECONDS = 90.0  # reconciler_over's


def renewed_at(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def two_nodes(retention_seconds: float = 600.0) -> tuple[FakeKube, Cache, Reconciler, Clock]:
    kube_, cache, clock = FakeKube(), Cache(), Clock()
    kube_.swapnodes, kube_.leases = kube_.swapnodes[:2], kube_.leases[:2]
    for lease in kube_.leases:
        lease["spec"]["renewTime"] = renewed_at(START)
    reconciler = reconciler_over(kube_, FakeAgents(), cache)
    reconciler.clock = clock
    reconciler.settings = dataclasses.replace(
        reconciler.settings, dead_node_retention_seconds=retention_seconds
    )
    cache.complete_deployments([deployment(i) for i in range(4)])
    cache.complete_swapnodes(kube_.swapnodes)
    return kube_, cache, reconciler, clock


@pytest.mark.asyncio
async def test_a_live_nodes_deleted_swapnode_keeps_its_models() -> None:
    kube_, cache, reconciler, _ = two_nodes()
    await reconciler.turn()
    where = {name: status["node"] for name, status in kube_.statuses.items()}
    assert set(where.values()) <= {"node-00", "node-01"}
    agents: Any = reconciler.agents
    pushes = {node: len(agent.sets) for node, agent in agents.agents.items()}

    for node in ("node-00", "node-01"):
        cache.drop_swapnode(node)  # kubectl delete swapnode; both Leases stay fresh
    reconciler.placer.last_plan = None  # plan again, not from the memo
    await reconciler.turn()
    assert {n: s["node"] for n, s in kube_.statuses.items()} == where
    assert all(s["conditions"][1]["reason"] != "NodeLost" for s in kube_.statuses.values())
    reconciler.pusher._sent.clear()  # every set due again: pushed to the agents as before
    await reconciler.turn()
    assert all(len(agents.agents[n].sets) > pushes[n] for n in pushes)
    assert kube_.swapnode_writes == []  # neither labelled again nor deleted


@pytest.mark.asyncio
async def test_a_lost_nodes_swapnode_is_labelled_then_deleted_after_the_retention() -> None:
    kube_, _cache, reconciler, clock = two_nodes(retention_seconds=600)
    kube_.leases[1]["spec"]["renewTime"] = renewed_at(START - GRACE_SECONDS - 1)  # lost 1 s ago
    await reconciler.turn()
    assert kube_.swapnode_writes == [("patch_swapnode", "node-01")]
    for node in kube_.swapnodes:  # node-00 is labelled Live already
        assert (node["metadata"].get("labels") or {}).get(LEASE_LABEL) == "Live"

    clock.now = START + 598  # lost 599 s ago
    await reconciler.turn()
    assert ("delete_swapnode", "node-01") not in kube_.swapnode_writes
    clock.now = START + 600  # lost 601 s ago: past the retention
    await reconciler.turn()
    assert kube_.swapnode_writes[-1] == ("delete_swapnode", "node-01")
    assert ("delete_swapnode", "node-00") not in kube_.swapnode_writes


@pytest.mark.asyncio
async def test_a_swapnode_without_any_lease_counts_from_when_it_was_first_seen() -> None:
    kube_, _cache, reconciler, clock = two_nodes(retention_seconds=60)
    del kube_.leases[1]
    await reconciler.turn()
    clock.now = START + 59
    await reconciler.turn()
    assert ("delete_swapnode", "node-01") not in kube_.swapnode_writes
    clock.now = START + 61
    await reconciler.turn()
    assert ("delete_swapnode", "node-01") in kube_.swapnode_writes


class Refusing(FakeKube):
    async def call(self, helper: Any, *args: Any, **kwargs: Any) -> Any:
        if helper.__name__ in ("patch_swapnode", "delete_swapnode"):
            self.swapnode_writes.append((helper.__name__, args[0]))
            raise kube.KubeError("forbidden", status=403)
        return await super().call(helper, *args, **kwargs)


@pytest.mark.asyncio
async def test_a_refused_label_or_delete_is_logged_once_and_the_turn_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusing, cache, clock = Refusing(), Cache(), Clock()
    refusing.swapnodes, refusing.leases = refusing.swapnodes[:1], []  # no Lease: lost
    reconciler = reconciler_over(refusing, FakeAgents(), cache)
    reconciler.clock = clock
    cache.complete_deployments([deployment(0)])
    cache.complete_swapnodes(refusing.swapnodes)
    with caplog.at_level(logging.WARNING, logger="modelswap_operator.reconciler"):
        for step in range(3):
            clock.now = START + step * 400.0  # the third turn is past the retention
            await reconciler.turn()
    warnings = [r.getMessage() for r in caplog.records if "SwapNode node-00" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert ("delete_swapnode", "node-00") in refusing.swapnode_writes
    status = refusing.statuses["m0"]  # the model was still reported on: the turn went on
    assert status["phase"] == "Pending"


def test_the_dead_node_retention_is_a_flag_and_a_variable() -> None:
    import argparse

    from modelswap_operator.command import register, settings_from
    from modelswap_operator.errors import SettingsError

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())

    def args(*words: str) -> argparse.Namespace:
        return parser.parse_args(["operator", *words])

    assert settings_from(args(), {}).dead_node_retention_seconds == 600
    flag = settings_from(args("--dead-node-retention-seconds", "30"), {})
    assert flag.dead_node_retention_seconds == 30
    env = {"MODELSWAP_DEAD_NODE_RETENTION_SECONDS": "45"}
    assert settings_from(args(), env).dead_node_retention_seconds == 45
    with pytest.raises(SettingsError, match="--dead-node-retention-seconds"):
        settings_from(args("--dead-node-retention-seconds", "-1"), {})
