"""Keeping SwapNodes to their nodes' Leases: the Lease alone decides whether a node is live. A
live node whose SwapNode was deleted keeps its models (its last SwapNode stands in until
its agent creates it again); a lost node's SwapNode is labelled so (`LEASE_LABEL`, a
printer column) and deleted once its Lease has been stale for `dead_node_retention_seconds`
(only the version seen lost: one its agent wrote meanwhile stays):
`turn_plan.plan_swapnodes` decides. `SwapNodeKeeper` owns the memo of what it labelled and
since when a node without any Lease counts as lost."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from modelswap_api import kube
from modelswap_operator.cache import Cache, Snapshot
from modelswap_operator.kubeio import KubeIO
from modelswap_operator.reading import lost_since
from modelswap_operator.turn_plan import (
    LEASE_EXPIRED,
    LEASE_LABEL,
    DeleteSwapNode,
    plan_swapnodes,
)

log = logging.getLogger(__name__)


def with_departed(cache: Cache, snap: Snapshot, now: float, grace_seconds: float) -> Snapshot:
    """`snap` with each deleted SwapNode whose node's Lease is still fresh put back
    (the node is alive and its agent creates it again); the cache forgets the others."""
    kept, gone = {}, []
    for name, body in snap.departed.items():
        if name in snap.swapnodes:
            continue
        lost = lost_since(snap.leases.get(name), grace_seconds)
        if lost is not None and now <= lost:
            kept[name] = body
        else:
            gone.append(name)
    cache.forget_departed(gone)
    if not kept:
        return snap
    return dataclasses.replace(snap, swapnodes={**snap.swapnodes, **kept})


class SwapNodeKeeper:
    def __init__(self, io: KubeIO) -> None:
        self.io = io
        #: When this process first saw a SwapNode with no Lease at all (it counts as lost
        #: from then): by node name.
        self._unleased_since: dict[str, float] = {}
        #: SwapNodes whose label or deletion the API server refused (logged once each).
        self._refused: set[str] = set()
        #: Per SwapNode: (the resourceVersion it was labelled over, the label written):
        #: until the watch brings the labelled object, a turn does not write it again.
        self._labels: dict[str, tuple[Any, str]] = {}

    async def keep(
        self,
        snap: Snapshot,
        live: set[str],
        now: float,
        *,
        grace_seconds: float,
        retention_seconds: float,
    ) -> None:
        """Carry out `turn_plan.plan_swapnodes`: label each SwapNode with its Lease's
        state; delete those lost for longer than `retention_seconds`."""
        plan = plan_swapnodes(snap, live, now, grace_seconds=grace_seconds,
                              retention_seconds=retention_seconds,
                              unleased_since=self._unleased_since, labels=self._labels)  # fmt: skip
        self._unleased_since, self._labels = dict(plan.unleased_since), dict(plan.labels)
        for action in plan.actions:
            if isinstance(action, DeleteSwapNode):
                await self._delete(action)
            elif await self._label(action.name, action.value, retention_seconds):
                self._labels[action.name] = (action.version, action.value)

    async def _label(self, name: str, value: str, retention_seconds: float) -> bool:
        """Whether the label was written."""
        try:
            await self.io.call(
                kube.patch_swapnode, name, {"metadata": {"labels": {LEASE_LABEL: value}}}
            )
        except kube.NotFound:
            return False
        except kube.KubeError as e:
            if name not in self._refused:
                self._refused.add(name)
                log.warning("SwapNode %s: cannot label it %s=%s: %s", name, LEASE_LABEL, value, e)
            return False
        self._refused.discard(name)
        if value == LEASE_EXPIRED:
            log.info("SwapNode %s: its node's Lease is stale (deleted after %g s more)",
                     name, retention_seconds)  # fmt: skip
        return True

    async def _delete(self, action: DeleteSwapNode) -> None:
        name = action.name
        try:
            deleted = await self.io.call(
                kube.delete_swapnode, name, resource_version=action.version
            )
        except kube.Conflict:
            return  # written meanwhile (its agent is back?): judged again next turn
        except kube.KubeError as e:
            if name not in self._refused:
                self._refused.add(name)
                log.warning("SwapNode %s: cannot delete it: %s", name, e)
            return
        self._unleased_since.pop(name, None)
        if deleted:
            log.info("deleted SwapNode %s: its node's Lease has been stale for %.0f s",
                     name, action.lost_seconds)  # fmt: skip
