"""What the operator knows of the cluster: ModelDeployments, SwapNodes and node Leases.

kopf's handlers put what they see here and ring `changed`; the planner loop reads a
snapshot. An object is kept at its newest resourceVersion (a watch event older than a
listing the loop made itself is ignored). The loop acts only once the cache is complete:
it lists each kind once at start (`complete_*`), so no model is planned against a partial
view of the nodes, and no node's set is pushed before every model it hosts is known.

A deleted SwapNode is remembered (`departed`): its node's Lease, not the object, says
whether the node is alive, and a live node's agent creates its SwapNode again. Until it
has written the new one's status, the last status seen stands in for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Body = Mapping[str, Any]


def _version(body: Body) -> int:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def uid_of(body: Body) -> str:
    return str((body.get("metadata") or {}).get("uid") or "")


def name_of(body: Body) -> str:
    return str((body.get("metadata") or {}).get("name") or "")


@dataclass(frozen=True)
class Snapshot:
    """The cache at one instant (the bodies are the cache's own: do not mutate them)."""

    deployments: Mapping[str, Body]  # by uid
    swapnodes: Mapping[str, Body]  # by name
    leases: Mapping[str, Body]  # by node name
    #: SwapNodes deleted while this process watched, by name: the last body seen
    departed: Mapping[str, Body] = dataclasses.field(default_factory=dict)


class Cache:
    def __init__(self) -> None:
        self._deployments: dict[str, Body] = {}
        self._swapnodes: dict[str, Body] = {}
        self._leases: dict[str, Body] = {}
        self._departed: dict[str, Body] = {}
        self._gone: set[str] = set()  # uids seen deleted: a late listing must not revive them
        self._complete = {"deployments": False, "swapnodes": False, "leases": False}
        self.changed = asyncio.Event()

    # -- writers: kopf handlers and the loop's own listings ---------------------------------

    def put_deployment(self, body: Body) -> None:
        uid = uid_of(body)
        if uid and uid not in self._gone and _newer(self._deployments.get(uid), body):
            self._deployments[uid] = body
            self.changed.set()

    def drop_deployment(self, uid: str) -> None:
        self._gone.add(uid)
        if self._deployments.pop(uid, None) is not None:
            self.changed.set()

    def put_swapnode(self, body: Body) -> None:
        name = name_of(body)
        if not name:
            return
        before = self._swapnodes.get(name)
        departed = self._departed.pop(name, None)
        if before is None and departed is not None and not _reported(body):
            # Created again by its agent, which writes its status next: meanwhile the
            # node is what it was (its models stay put, its agent stays reachable).
            body = {**body, "status": departed.get("status")}
        elif (
            before is not None
            and _reported(before)
            and not _reported(body)
            and _version(body) >= _version(before)
        ):
            body = {**body, "status": before.get("status")}
        if _newer(before, body):
            self._swapnodes[name] = body
            self.changed.set()

    def drop_swapnode(self, name: str) -> None:
        body = self._swapnodes.pop(name, None)
        if body is not None:
            self._departed[name] = body
            self.changed.set()

    def forget_departed(self, names: Iterable[str]) -> None:
        """Stop remembering these deleted SwapNodes (their nodes' Leases ran out)."""
        for name in names:
            self._departed.pop(name, None)

    def complete_deployments(self, bodies: Iterable[Body]) -> None:
        for body in bodies:
            self.put_deployment(body)
        self._complete["deployments"] = True
        self.changed.set()

    def complete_swapnodes(self, bodies: Iterable[Body]) -> None:
        for body in bodies:
            self.put_swapnode(body)
        self._complete["swapnodes"] = True
        self.changed.set()

    def set_leases(self, bodies: Iterable[Body]) -> None:
        """The node Leases as just listed (the loop lists them each turn: staleness is a
        matter of time, which no watch event reports)."""
        self._leases = {name_of(b): b for b in bodies if name_of(b)}
        self._complete["leases"] = True

    # -- readers ---------------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        return all(self._complete.values())

    def snapshot(self) -> Snapshot:
        return Snapshot(
            dict(self._deployments), dict(self._swapnodes), dict(self._leases),
            dict(self._departed),
        )  # fmt: skip


def _newer(old: Body | None, new: Body) -> bool:
    return old is None or _version(new) >= _version(old)


def _reported(body: Body) -> bool:
    """The SwapNode's agent has written its status (an endpoint to reach it by)."""
    return bool((body.get("status") or {}).get("endpoint"))
