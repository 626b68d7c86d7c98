"""Pointing each placed model's Service and EndpointSlice at its node's gateway, the
endpoint `ready` exactly when a request sent now is answered (`status.serves`, the Ready
rule less the routing). `Routes` owns the memo of what it routed and from which inputs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from modelswap_api import kube
from modelswap_operator import routing
from modelswap_operator.cache import Body, Snapshot
from modelswap_operator.status import Observed, Verdict
from modelswap_operator.turn_plan import EnsureRoute, plan_routes

log = logging.getLogger(__name__)

#: Per placed uid: (routed, the problem when not).
Routed = dict[str, tuple[bool, str | None]]


class Routes:
    def __init__(self, router: routing.Router) -> None:
        self.router = router
        #: Per routed uid: its (namespace, name).
        self._routed: dict[str, tuple[str, str]] = {}
        #: Per routed uid: what its route was last ensured from (`turn_plan.route_key`);
        #: the same key again needs no call at all, not even a task (2,000 of them a turn
        #: cost more than the rest of the routing).
        self._keys: dict[str, tuple[Any, ...]] = {}

    async def unroute(self, uid: str, body: Body) -> None:
        self._routed.pop(uid, None)
        self._keys.pop(uid, None)
        metadata = body["metadata"]
        try:
            await self.router.remove(metadata["namespace"], metadata["name"])
        except kube.KubeError as e:
            log.warning("removing the route of %s failed: %s", uid, e)

    async def route_all(
        self,
        snap: Snapshot,
        verdicts: Mapping[str, Verdict],
        observed: Mapping[str, Observed],
        *,
        limit: int,
    ) -> Routed:
        """(routed, problem) per placed uid (`turn_plan.plan_routes`). Models are routed
        side by side (each one's Service, then its EndpointSlice), `limit` at once."""
        plan = plan_routes(snap, verdicts, observed, generation=self.router.generation,
                           keys=self._keys, routed=self._routed)  # fmt: skip
        routed: Routed = {uid: (True, None) for uid in plan.routed}
        routed.update((uid, (False, problem)) for uid, problem in plan.problems.items())
        for uid in set(verdicts) - set(plan.routed):
            self._keys.pop(uid, None)  # ensured again, or no longer routed from it
        semaphore = asyncio.Semaphore(limit)

        async def ensure(route: EnsureRoute) -> None:
            async with semaphore:
                routed[route.uid] = await self._ensure(route)

        async def unroute(uid: str) -> None:
            async with semaphore:
                await self.unroute(uid, snap.deployments[uid])

        await asyncio.gather(*map(unroute, plan.unroute), *map(ensure, plan.ensure))
        return routed

    async def _ensure(self, route: EnsureRoute) -> tuple[bool, str | None]:
        try:
            await self.router.ensure(route.namespace, route.owner, route.gateway, route.node,
                                     ready=route.ready, new=route.new)  # fmt: skip
        except routing.RouteError as e:
            return (False, str(e))
        except kube.KubeError as e:
            self.router.forget()
            return (False, f"writing the Service or EndpointSlice failed: {e}")
        self._routed[route.uid] = (route.namespace, str(route.owner["name"]))
        if route.key[0] == self.router.generation:
            self._keys[route.uid] = route.key
        return (True, None)
