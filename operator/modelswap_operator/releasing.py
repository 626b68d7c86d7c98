"""Releasing deleted models (`turn_plan.plan_releases`): once a node's accepted set no longer
holds a uid, the node is asked to forget it (HBM and host bytes); the finalizer waits for
that (`is_released`). A uid a node reports that no ModelDeployment has any more is released
the same way. `Releaser` owns the memo of what each node forgot and which uids are
released."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from modelswap_api.models import HostedModel
from modelswap_operator.agents import AgentAddress, AgentClients
from modelswap_operator.cache import Body, Snapshot
from modelswap_operator.errors import AgentError, AgentRefused
from modelswap_operator.placing import Placer
from modelswap_operator.pushing import Pusher
from modelswap_operator.route_keeping import Routes
from modelswap_operator.tokens import TokenSource
from modelswap_operator.turn_plan import plan_releases

log = logging.getLogger(__name__)


class Releaser:
    def __init__(
        self,
        *,
        agents: AgentClients,
        tokens: TokenSource,
        pusher: Pusher,
        placer: Placer,
        routes: Routes,
    ) -> None:
        self.agents = agents
        self.tokens = tokens
        self.pusher = pusher
        self.placer = placer
        self.routes = routes
        self._forgotten: set[tuple[str, str]] = set()
        self._released: set[str] = set()
        self._waiters: dict[str, asyncio.Event] = {}

    def is_released(self, uid: str) -> bool:
        """A deleted model's bytes are gone from every live node (the finalizer may go)."""
        return uid in self._released

    def waiter(self, uid: str) -> asyncio.Event:
        """An event set once `uid` is released."""
        return self._waiters.setdefault(uid, asyncio.Event())

    @property
    def released(self) -> AbstractSet[str]:
        return self._released

    async def release_all(
        self, snap: Snapshot, live: set[str], reports: Mapping[str, Mapping[str, HostedModel]]
    ) -> None:
        """Carry out `turn_plan.plan_releases`: ask each holder to forget each uid, and
        call it released once every holder has."""
        releases = plan_releases(snap.deployments, live, reports,
                                 assignments=self.placer.assignments, sent=self.pusher.sent_sets,
                                 forgotten=self._forgotten)  # fmt: skip
        for release in releases:
            uid = release.uid
            self.placer.drop(uid)
            for node in release.forget_on:
                await self._forget(snap.swapnodes[node], uid)
            if all((node, uid) in self._forgotten for node in release.holders):
                if release.deleting and uid not in self._released:
                    body = snap.deployments[uid]
                    metadata = body["metadata"]
                    where = sorted(release.holders) or "no live node"
                    log.info("released %s/%s (%s) on %s", metadata.get("namespace"),
                             metadata.get("name"), uid, where)  # fmt: skip
                    await self.routes.unroute(uid, body)
                self._released.add(uid)
                if (waiter := self._waiters.pop(uid, None)) is not None:
                    waiter.set()
        # Forget what no node reports any more, so the sets stay small.
        self._forgotten = {(n, u) for n, u in self._forgotten if n in live and u in reports[n]}

    async def _forget(self, swapnode: Body, uid: str) -> None:
        node = str(swapnode["metadata"]["name"])
        address = AgentAddress.of(swapnode)
        if address is None:
            return
        try:
            client = await self.agents.for_node(address, self.tokens())
            reason = await client.delete_model(uid)
        except AgentRefused as e:
            if e.reason != "StillDesired":
                log.warning("node %s refused to forget %s: %s", node, uid, e)
            return
        except AgentError as e:
            log.warning("node %s: forgetting %s failed: %s", node, uid, e)
            return
        log.info("node %s forgot %s (%s)", node, uid, reason)
        self._forgotten.add((node, uid))
