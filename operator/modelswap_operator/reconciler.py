"""The planner loop: one plan per batch of changes, then pushes, releases, routes, status.

kopf's handlers only put objects into the `Cache` and ring its `changed` event; this loop
is the only place that decides or writes anything, so two plans never pack models into
the same free bytes. A turn takes a snapshot of the cache (and lists the node Leases:
staleness is a matter of time, which no watch reports), then hands it to one part per
concern, each of which owns its memo of what it did:

1. `swapnode_keeping`: a node whose Lease was renewed within the grace period is live
   (the Lease alone decides: a live node whose SwapNode was deleted keeps its models); a
   lost node's SwapNode is labelled so and deleted after the dead-node retention;
2. `placing`: plans every live ModelDeployment over the live SwapNodes, keeping each model
   where its status (or the previous turn) put it unless it must move (`planner`, pure);
3. `entry_building`: builds each live node's full desired set, checking every entry as
   the agent will; `pushing` pushes it when it changed, when the last push failed, or
   every grace/3, under a term the live agents accept (`terms`);
4. `releasing`: once a node's accepted set no longer holds a deleted (or orphaned) uid,
   asks it to forget the uid; the finalizer waits for that (`is_released`);
5. `route_keeping`: points each placed model's Service and EndpointSlice at its node's
   gateway, the endpoint `ready` exactly when a request sent now is answered (what each
   node reports of a model is read first: `observing`);
6. `status_writing`: writes each ModelDeployment's status when it changed (one patch per
   object per turn), with an Event for every condition that changed.
Assignments are kept in `status.node`/`status.gpu`, so a restarted operator plans from them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from modelswap_api import kube
from modelswap_api.errors import ContractError
from modelswap_api.models import HostedModel, ModelDeployment
from modelswap_operator import routing
from modelswap_operator.agents import AgentClients
from modelswap_operator.cache import Cache
from modelswap_operator.entry_building import EntryBuilder
from modelswap_operator.events import EventRecorder
from modelswap_operator.kubeio import KubeIO
from modelswap_operator.metrics import OperatorMetrics
from modelswap_operator.observing import observe_all
from modelswap_operator.placing import Placer
from modelswap_operator.pushing import Pusher
from modelswap_operator.reading import (
    ReadOnce,
    deleting,
    live_nodes,
    read_deployment,
    reported_models,
)
from modelswap_operator.releasing import Releaser
from modelswap_operator.route_keeping import Routes
from modelswap_operator.settings import OperatorSettings
from modelswap_operator.status import Verdict
from modelswap_operator.status_writing import StatusWriter
from modelswap_operator.swapnode_keeping import SwapNodeKeeper, with_departed
from modelswap_operator.tokens import TokenSource

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(
        self,
        settings: OperatorSettings,
        cache: Cache,
        *,
        io: KubeIO,
        agents: AgentClients,
        events: EventRecorder,
        metrics: OperatorMetrics,
        term: Callable[[], int],
        tokens: TokenSource,
        clock: Callable[[], float] = time.time,
        confirm_leading: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """`term` answers the leader Lease's term; `confirm_leading` reads the Lease and
        answers whether this process still holds it (None: never raise the term after a
        refused push, only before the first)."""
        self.settings = settings
        self.cache = cache
        self.io = io
        self.agents = agents
        self.events = events
        self.metrics = metrics
        self.tokens = tokens
        self.clock = clock
        self.router = routing.Router(io)
        self.swapnodes = SwapNodeKeeper(io)
        self.placer = Placer(metrics)
        self.pusher = Pusher(agents=agents, tokens=tokens, metrics=metrics, term=term,
                             confirm_leading=confirm_leading)  # fmt: skip
        self.statuses = StatusWriter(io=io, events=events, metrics=metrics)
        self.entries = EntryBuilder(io, statuses_written=lambda: self.statuses.written,
                                    refusals=lambda: self.pusher.refusals)  # fmt: skip
        self.routes = Routes(self.router)
        self.releaser = Releaser(agents=agents, tokens=tokens, pusher=self.pusher,
                                 placer=self.placer, routes=self.routes)  # fmt: skip
        self._ready = asyncio.Event()
        #: Each cached body's decoding, kept while the cache holds that very body (a new
        #: watch event brings a new dict): a turn decodes only what changed since the last.
        self._deployments_read: ReadOnce[ModelDeployment | ContractError] = ReadOnce(
            read_deployment
        )
        self._reports_read: ReadOnce[dict[str, HostedModel]] = ReadOnce(reported_models)

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        """List every kind once (the cache is then complete), then turn on each batch of
        changes or each tick."""
        await self._complete_cache()
        self._ready.set()
        while True:
            try:
                await asyncio.wait_for(self.cache.changed.wait(), self.settings.tick_seconds)
                await asyncio.sleep(self.settings.batch_seconds)  # let a burst gather
            except TimeoutError:
                pass
            self.cache.changed.clear()
            started = time.monotonic()
            try:
                await self.turn()
            except kube.KubeError as e:
                log.warning("reconcile turn stopped by the API server: %s", e)
                self.router.forget()
            self.metrics.turns.inc()
            self.metrics.turn_seconds.observe(time.monotonic() - started)

    @property
    def ready(self) -> bool:
        """The caches are complete and the loop is turning (for /readyz)."""
        return self._ready.is_set()

    async def _complete_cache(self) -> None:
        while True:
            try:
                namespaces = self.settings.namespaces or (None,)
                bodies: list[dict[str, object]] = []
                for namespace in namespaces:
                    bodies += await self.io.call(kube.list_model_deployments, namespace)
                self.cache.complete_deployments(bodies)
                self.cache.complete_swapnodes(await self.io.call(kube.list_swapnodes))
                return
            except kube.KubeError as e:
                log.warning("listing ModelDeployments and SwapNodes failed, retrying: %s", e)
                await asyncio.sleep(self.settings.tick_seconds)

    @property
    def current_term(self) -> int:
        """The term this leader's desired sets carry."""
        return self.pusher.current_term

    def is_released(self, uid: str) -> bool:
        """A deleted model's bytes are gone from every live node (the finalizer may go)."""
        return self.releaser.is_released(uid)

    async def wait_released(self, uid: str, timeout_seconds: float) -> bool:
        """Wait until `is_released(uid)`; False at the deadline."""
        if self.releaser.is_released(uid):
            return True
        event = self.releaser.waiter(uid)
        self.cache.changed.set()
        try:
            await asyncio.wait_for(event.wait(), timeout_seconds)
        except TimeoutError:
            return False
        return True

    # -- one turn ------------------------------------------------------------------------------

    async def turn(self) -> None:
        settings = self.settings
        await self.tokens.ensure()
        leases = await self.io.call(kube.list_leases, settings.node_lease_namespace)
        self.cache.set_leases(leases)
        snap = self.cache.snapshot()
        now = self.clock()
        snap = with_departed(self.cache, snap, now, settings.grace_seconds)
        live = live_nodes(snap.swapnodes, snap.leases, now, settings.grace_seconds)
        await self.swapnodes.keep(
            snap, live, now, grace_seconds=settings.grace_seconds,
            retention_seconds=settings.dead_node_retention_seconds,
        )  # fmt: skip
        reports = {name: self._reports_read(name, snap.swapnodes[name]) for name in live}
        self._reports_read.keep(snap.swapnodes)

        active: list[ModelDeployment] = []
        unreadable: dict[str, Verdict] = {}
        for uid, body in snap.deployments.items():
            deployment = self._deployments_read(uid, body)
            if isinstance(deployment, ContractError):  # e.g. stored under an older schema
                unreadable[uid] = Verdict(reason="InvalidSpec", message=str(deployment),
                                          problem_field="spec", policy_invalid=True)  # fmt: skip
                continue
            if not deleting(body):
                active.append(deployment)
        self._deployments_read.keep(snap.deployments)

        verdicts = self.placer.place(snap.swapnodes, snap.deployments, live, active,
                                     settings.defaults)  # fmt: skip
        verdicts.update(unreadable)
        entries = await self.entries.build(
            live, active, verdicts, reports, snap.deployments,
            credential_namespaces=settings.credential_namespaces,
        )  # fmt: skip
        await self.pusher.push_all(snap, live, entries, now, limit=settings.max_parallel_calls,
                                   interval_seconds=settings.push_interval_seconds)  # fmt: skip
        await self.releaser.release_all(snap, live, reports)
        observed = observe_all(snap, verdicts, live, reports, sent=self.pusher.sent,
                               status_of=self.statuses.latest,
                               model_generation=self.entries.model_generation)  # fmt: skip
        routed = await self.routes.route_all(snap, verdicts, observed, limit=settings.kube_threads)
        stamp = datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.statuses.write_all(snap, verdicts, observed, routed, stamp=stamp,
                                      released=self.releaser.released,
                                      limit=settings.kube_threads)  # fmt: skip
        for part in (self.statuses, self.entries, self.pusher):
            part.keep(snap.deployments)
        self.metrics.nodes.labels("true").set(len(live))
        self.metrics.nodes.labels("false").set(len(snap.swapnodes) - len(live))
        placed = sum(1 for v in verdicts.values() if v.node is not None)
        self.metrics.models.labels("true").set(placed)
        self.metrics.models.labels("false").set(len(verdicts) - placed)
