"""The planner loop: one plan per batch of changes, then pushes, releases, routes, status.

kopf's handlers only put objects into the `Cache` and ring its `changed` event; this loop
is the only place that decides or writes anything, so two plans never pack models into
the same free bytes. A turn:

1. lists the node Leases (staleness is a matter of time, which no watch reports): a node
   whose Lease was renewed within the grace period is live; the rest are lost. The Lease
   alone decides: a live node whose SwapNode was deleted keeps its models (its last
   SwapNode stands in until its agent creates it again), and a lost node's SwapNode is
   labelled so (`LEASE_LABEL`, a printer column) and deleted once its Lease has been
   stale for `dead_node_retention_seconds`;
2. plans every live ModelDeployment over the live SwapNodes, keeping each model where its
   status (or the previous turn) put it unless it must move (`planner.plan`, pure);
3. builds each live node's full desired set (`desired`), checking every entry as the agent
   will, and pushes it when it changed, when the last push failed, or every grace/3; the
   first turn first raises the term above every term the live agents have seen (`terms`:
   a deleted leader Lease restarts at 0), and a push refused for its revision raises it
   above that agent's, once, while this process still holds the Lease;
4. releases deleted models: once a node's accepted set no longer holds a uid, asks it to
   forget the uid (HBM and host bytes); the finalizer waits for that (`is_released`);
   a uid a node reports that no ModelDeployment has any more is released the same way;
5. points each placed model's Service and EndpointSlice at its node's gateway, the
   endpoint `ready` exactly when a request sent now is answered (`status.serves`, the
   Ready rule less the routing);
6. writes each ModelDeployment's status when it changed (one patch per object per turn),
   with an Event (a new one, or a bump of its series: `events`) for every condition that
   changed.
Assignments are kept in `status.node`/`status.gpu`, so a restarted operator plans from them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from modelswap_api import kube
from modelswap_api.control import (
    DesiredEntry,
    DesiredSet,
    EntryResult,
    Revision,
    SourceCredentials,
)
from modelswap_api.errors import ContractError
from modelswap_api.models import HostedModel, ModelDeployment, SwapNode
from modelswap_operator import desired, model_generations, planner, routing, terms
from modelswap_operator.agents import AgentAddress, AgentClients
from modelswap_operator.cache import Body, Cache, Snapshot
from modelswap_operator.errors import (
    AgentError,
    AgentRefused,
    CredentialsNotPermitted,
    TermExhausted,
)
from modelswap_operator.events import EventRecorder
from modelswap_operator.kubeio import KubeIO
from modelswap_operator.metrics import OperatorMetrics
from modelswap_operator.planning.eligibility import NodeView, node_views
from modelswap_operator.settings import OperatorSettings
from modelswap_operator.status import (
    CREDENTIALS_NOT_OPTED_IN,
    CREDENTIALS_UNAVAILABLE,
    HELD_PHASES,
    Observed,
    Verdict,
    build_status,
    events_between,
    serves,
    status_changed,
)
from modelswap_operator.tokens import TokenSource

log = logging.getLogger(__name__)


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def live_nodes(
    swapnodes: Mapping[str, Body], leases: Mapping[str, Body], now: float, grace_seconds: float
) -> set[str]:
    """Nodes with a SwapNode whose Lease was renewed within the grace period."""
    live = set()
    for name in swapnodes:
        spec = (leases.get(name) or {}).get("spec") or {}
        renewed = _parse_time(spec.get("renewTime"))
        if renewed is not None and now - renewed <= grace_seconds:
            live.add(name)
    return live


#: The SwapNode label the operator keeps to its node's Lease (the `Lease` printer column).
LEASE_LABEL = "modelswap.io/lease"
LEASE_LIVE = "Live"
LEASE_EXPIRED = "Expired"


def lost_since(lease: Body | None, grace_seconds: float) -> float | None:
    """When a node with this Lease was lost (its last renewal plus the grace period);
    None when the Lease holds no renewal time."""
    renewed = _parse_time(((lease or {}).get("spec") or {}).get("renewTime"))
    return None if renewed is None else renewed + grace_seconds


def reported_models(swapnode: Body) -> dict[str, HostedModel]:
    """The models a SwapNode's status lists, by uid."""
    found = {}
    for model in (swapnode.get("status") or {}).get("models") or ():
        try:
            hosted = HostedModel.from_dict(model)
        except ContractError:
            continue
        found[hosted.uid] = hosted
    return found


def _deleting(body: Body) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


def _model_name(body: Body) -> str:
    """The name users call the model by (spec.model.name, else metadata.name), read from
    the raw body: a body that does not parse still shows its name."""
    model = (body.get("spec") or {}).get("model") or {}
    name = model.get("name") if isinstance(model, dict) else None
    return str(name or body["metadata"]["name"])


def _deployment(body: Body) -> ModelDeployment:
    return ModelDeployment.from_dict(
        {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    )


def _read_deployment(body: Body) -> ModelDeployment | ContractError:
    try:
        return _deployment(body)
    except ContractError as e:
        return e


def _read_swapnode(body: Body) -> SwapNode | ContractError:
    try:
        return SwapNode.from_dict(body)
    except ContractError as e:
        return e


R = TypeVar("R")


class _ReadOnce(Generic[R]):
    """`read(body)` remembered per key for as long as the cache holds that very body.

    The cache replaces a body with a new dict on every watch event and never mutates one
    (`Snapshot`), so the same dict object means the same content."""

    def __init__(self, read: Callable[[Body], R]) -> None:
        self._read = read
        self._seen: dict[str, tuple[Body, R]] = {}

    def __call__(self, key: str, body: Body) -> R:
        seen = self._seen.get(key)
        if seen is not None and seen[0] is body:
            return seen[1]
        result = self._read(body)
        self._seen[key] = (body, result)
        return result

    def keep(self, keys: Mapping[str, Any]) -> None:
        """Forget what the cache no longer holds."""
        for key in [k for k in self._seen if k not in keys]:
            del self._seen[key]


#: Entries one push may leave out after the agent refused them, before it gives up.
MAX_REFUSED_PER_PUSH = 8
#: The agent's 409 reasons for a revision below the highest it has seen.
OUTRANKED_REASONS = frozenset({"OlderTerm", "OlderRevision"})


@dataclass(frozen=True)
class _Refusal:
    uid: str
    generation: int
    namespace: str
    name: str
    field: str
    message: str


@dataclass
class _Sent:
    """The last set pushed to a node and how it went."""

    entries: list[DesiredEntry]
    at: float
    ok: bool
    error: str | None = None
    results: dict[str, EntryResult] = field(default_factory=dict)


@dataclass(frozen=True)
class _Planned:
    """A plan and what it was made from (the defaults are the settings', fixed)."""

    views: tuple[NodeView, ...]
    deployments: list[ModelDeployment]
    assignments: dict[str, planner.Assignment]
    plan: planner.Plan

    def same_inputs(
        self,
        views: tuple[NodeView, ...],
        deployments: list[ModelDeployment],
        assignments: dict[str, planner.Assignment],
    ) -> bool:
        """Equal node views and assignments, and the very same decoded deployments (one
        is decoded again only when its body changed), in the same order."""
        return (
            len(deployments) == len(self.deployments)
            and all(a is b for a, b in zip(deployments, self.deployments, strict=True))
            and views == self.views
            and assignments == self.assignments
        )


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
        self.term = term
        self.tokens = tokens
        self.clock = clock
        self.confirm_leading = confirm_leading
        self.router = routing.Router(io)
        self._counter = 0
        #: The term pushed under when above the Lease's (`terms`); raised before the first
        #: push above what the live agents have seen, and after a push they refuse for it.
        self._term_floor = 0
        self._terms_learned = False
        self._assignments: dict[str, planner.Assignment] = {}
        self._sent: dict[str, _Sent] = {}
        self._forgotten: set[tuple[str, str]] = set()
        self._released: set[str] = set()
        self._routed: dict[str, tuple[str, str]] = {}
        #: Per routed uid: what its route was last ensured from (`_route_key`); the same
        #: key again needs no call at all, not even a task (2,000 of them a turn cost more
        #: than the rest of the routing).
        self._route_keys: dict[str, tuple[Any, ...]] = {}
        #: The last plan made and its inputs: an idle turn (every input as before) plans
        #: nothing.
        self._last_plan: _Planned | None = None
        self._statuses: dict[str, dict[str, Any]] = {}
        #: Per uid: (digest of spec.model, model generation) last sent (`model_generations`),
        #: kept until its status records them.
        self._model_generations: dict[str, tuple[str, int]] = {}
        self._release_waiters: dict[str, asyncio.Event] = {}
        #: (uid, generation) -> (field, message) of entries an agent refused.
        self._refused: dict[tuple[str, int], tuple[str, str]] = {}
        self._ready = asyncio.Event()
        #: Each cached body's decoding, kept while the cache holds that very body (a new
        #: watch event brings a new dict): a turn decodes only what changed since the last.
        self._deployments_read: _ReadOnce[ModelDeployment | ContractError] = _ReadOnce(
            _read_deployment
        )
        self._swapnodes_read: _ReadOnce[SwapNode | ContractError] = _ReadOnce(_read_swapnode)
        self._reports_read: _ReadOnce[dict[str, HostedModel]] = _ReadOnce(reported_models)
        #: Per uid: the inputs of the status last built and the status then in effect; the
        #: same inputs over the same status build the same status again (nothing to write).
        self._status_inputs: dict[str, tuple[Any, Mapping[str, Any] | None]] = {}
        #: When this process first saw a SwapNode with no Lease at all (it counts as lost
        #: from then): by node name.
        self._unleased_since: dict[str, float] = {}
        #: SwapNodes whose label or deletion the API server refused (logged once each).
        self._lease_label_refused: set[str] = set()
        #: Per SwapNode: (the resourceVersion it was labelled over, the label written):
        #: until the watch brings the labelled object, a turn does not write it again.
        self._lease_labels: dict[str, tuple[Any, str]] = {}

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
                bodies: list[Body] = []
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
        return max(self.term(), self._term_floor)

    def is_released(self, uid: str) -> bool:
        """A deleted model's bytes are gone from every live node (the finalizer may go)."""
        return uid in self._released

    async def wait_released(self, uid: str, timeout_seconds: float) -> bool:
        """Wait until `is_released(uid)`; False at the deadline."""
        if uid in self._released:
            return True
        event = self._release_waiters.setdefault(uid, asyncio.Event())
        self.cache.changed.set()
        try:
            await asyncio.wait_for(event.wait(), timeout_seconds)
        except TimeoutError:
            return False
        return True

    # -- one turn ------------------------------------------------------------------------------

    async def turn(self) -> None:
        await self.tokens.ensure()
        leases = await self.io.call(kube.list_leases, self.settings.node_lease_namespace)
        self.cache.set_leases(leases)
        snap = self.cache.snapshot()
        now = self.clock()
        snap = self._with_departed(snap, now)
        live = live_nodes(snap.swapnodes, snap.leases, now, self.settings.grace_seconds)
        await self._keep_swapnodes(snap, live, now)
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
            if not _deleting(body):
                active.append(deployment)
        self._deployments_read.keep(snap.deployments)

        verdicts = await self._plan(snap, live, active)
        verdicts.update(unreadable)
        entries = await self._entries(live, active, verdicts, reports, snap.deployments)
        if not self._terms_learned:
            await self._learn_terms(snap, live)
        await self._push_all(snap, live, entries, now)
        await self._release_all(snap, live, reports)
        observed = self._observe_all(snap, verdicts, live, reports)
        routed = await self._route_all(snap, verdicts, observed)
        await self._write_statuses(
            snap=snap,
            verdicts=verdicts,
            observed=observed,
            routed=routed,
        )
        self.metrics.nodes.labels("true").set(len(live))
        self.metrics.nodes.labels("false").set(len(snap.swapnodes) - len(live))
        placed = sum(1 for v in verdicts.values() if v.node is not None)
        self.metrics.models.labels("true").set(placed)
        self.metrics.models.labels("false").set(len(verdicts) - placed)

    async def _plan(
        self, snap: Snapshot, live: set[str], active: list[ModelDeployment]
    ) -> dict[str, Verdict]:
        nodes = []
        for name in sorted(live):
            node = self._swapnodes_read(name, snap.swapnodes[name])
            if isinstance(node, ContractError):
                log.warning("SwapNode %s cannot be read, leaving it out: %s", name, node)
                continue
            nodes.append(node)
        self._swapnodes_read.keep(snap.swapnodes)
        assignments = dict(self._assignments)
        for deployment in active:
            uid = str(deployment.metadata["uid"])
            status = snap.deployments[uid].get("status") or {}
            if uid not in assignments and status.get("node") and status.get("gpu"):
                assignments[uid] = planner.Assignment(node=status["node"], gpu=status["gpu"])
        views = node_views(nodes)
        last = self._last_plan
        if last is not None and last.same_inputs(views, active, assignments):
            plan = last.plan  # planning is pure: the same inputs, the same plan
        else:
            started = time.monotonic()
            plan = planner.plan_views(views, active, assignments, self.settings.defaults)
            self.metrics.plan_seconds.observe(time.monotonic() - started)
            self._assignments = {
                uid: planner.Assignment(node=p.node, gpu=p.gpu) for uid, p in plan.placed.items()
            }
        # this turn's inputs are kept even when they equal the last: the next turn's
        # assignments are then these very objects, compared by identity, not field by field
        self._last_plan = _Planned(views, active, assignments, plan)
        verdicts = {}
        for uid, p in plan.placed.items():
            verdicts[uid] = Verdict(node=p.node, gpu=p.gpu, policy=p.policy, reason=p.reason,
                                    message=p.message)  # fmt: skip
        for uid, u in plan.unplaced.items():
            verdicts[uid] = Verdict(policy=u.policy, reason=u.reason, message=u.message,
                                    problem_field=u.field,
                                    policy_invalid=u.reason == "PolicyInvalid")  # fmt: skip
        return verdicts

    async def _entries(
        self,
        live: set[str],
        active: list[ModelDeployment],
        verdicts: dict[str, Verdict],
        reports: Mapping[str, Mapping[str, HostedModel]],
        bodies: Mapping[str, Body],
    ) -> dict[str, list[DesiredEntry]]:
        """Each live node's set; a model whose entry cannot be sent gets its problem in its
        verdict instead (and is not sent: the agent would refuse the whole set).

        A model whose credentials cannot be resolved any more (its Secret deleted or
        emptied) while its node holds it is sent without them: the agent takes the change
        in place and the model keeps serving; its status says the source is unreachable.
        Left out, it would be unloaded after the grace period. A model not held yet is
        left out: a load would fail."""
        by_node: dict[str, list[DesiredEntry]] = {name: [] for name in live}
        secrets: dict[tuple[str, str], Body | CredentialsNotPermitted | None] = {}
        for deployment in active:
            uid = str(deployment.metadata["uid"])
            verdict = verdicts.get(uid)
            if verdict is None or verdict.node is None or verdict.policy is None:
                continue
            credentials: SourceCredentials | None = None
            reference = deployment.spec.model.source.credentials_secret_ref
            if reference is not None:
                key = (deployment.namespace, reference.name)
                if key not in secrets:
                    secrets[key] = await self._credentials_secret(*key)
                found = secrets[key]
                unusable: ValueError | None = None
                reason = CREDENTIALS_UNAVAILABLE
                if isinstance(found, CredentialsNotPermitted):
                    unusable, reason = found, CREDENTIALS_NOT_OPTED_IN
                else:
                    try:
                        credentials = desired.credentials_from_secret(found, reference.name)
                    except ValueError as e:
                        unusable = e
                if unusable is not None:
                    field_path = "spec.model.source.credentialsSecretRef"
                    hosted = (reports.get(verdict.node) or {}).get(uid)
                    if hosted is None or hosted.state not in HELD_PHASES:
                        verdicts[uid] = _with_problem(verdict, reason, field_path, str(unusable))
                        continue
                    verdicts[uid] = dataclasses.replace(
                        verdict, source_problem=f"{field_path}: {unusable}", source_reason=reason
                    )
            entry = desired.entry_for(
                deployment,
                gpu=verdict.gpu or "",
                policy=verdict.policy,
                credentials=credentials,
                model_generation=self._model_generation_of(deployment, bodies.get(uid)),
            )
            problem = desired.check_entry(entry)
            if problem is not None:
                verdicts[uid] = _with_problem(
                    verdict, problem.reason, problem.field, problem.message
                )
                continue
            if (refusal := self._refused.get((uid, entry.generation))) is not None:
                verdicts[uid] = _with_problem(verdict, "RefusedByAgent", *refusal)
                continue
            by_node[verdict.node].append(entry)
        return by_node

    def _model_generation_of(self, deployment: ModelDeployment, body: Body | None) -> int:
        """The model generation to send (`model_generations`), remembered until its status
        is written: `spec.model` changed since the last one makes a new instance."""
        uid = str(deployment.metadata["uid"])
        model_digest = model_generations.digest(deployment.spec.model)
        decided = model_generations.model_generation(
            generation=int(deployment.metadata.get("generation") or 1),
            model_digest=model_digest,
            status=self._statuses.get(uid) or (body or {}).get("status"),
            remembered=self._model_generations.get(uid),
        )
        self._model_generations[uid] = (model_digest, decided)
        return decided

    async def _credentials_secret(
        self, namespace: str, name: str
    ) -> Body | CredentialsNotPermitted | None:
        """A credentialsSecretRef Secret, None when there is none, or why it may not be
        read: a namespace that did not opt in (`settings.credential_namespaces`) is not
        asked at all; a 403 (RBAC and the settings disagree) is the model's problem, not a
        failed turn for every model."""
        refusal = desired.credentials_refusal(namespace, self.settings.credential_namespaces)
        if refusal is not None:
            return CredentialsNotPermitted(refusal)
        try:
            return await self.io.call(kube.read_secret, namespace, name)
        except kube.KubeError as e:
            if e.status != 403:
                raise
            return CredentialsNotPermitted(desired.forbidden_message(namespace, name))

    async def _push_all(
        self, snap: Snapshot, live: set[str], entries: dict[str, list[DesiredEntry]], now: float
    ) -> None:
        semaphore = asyncio.Semaphore(self.settings.max_parallel_calls)

        async def one(node: str) -> None:
            async with semaphore:
                await self._push(snap.swapnodes[node], entries[node], now)

        due = [node for node in sorted(live) if self._push_due(node, entries[node], now)]
        await asyncio.gather(*(one(node) for node in due))

    def _push_due(self, node: str, entries: list[DesiredEntry], now: float) -> bool:
        sent = self._sent.get(node)
        return (
            sent is None
            or not sent.ok
            or not desired.same_entries(sent.entries, entries)
            or now - sent.at >= self.settings.push_interval_seconds
        )

    async def _push(self, swapnode: Body, entries: list[DesiredEntry], now: float) -> None:
        """Push `entries`; an entry the agent refuses (400 naming `entries[i]`) is left out,
        remembered for its generation (its status says why) and the rest pushed again."""
        node = str(swapnode["metadata"]["name"])
        for _ in range(MAX_REFUSED_PER_PUSH):
            refused = await self._push_once(swapnode, entries, now)
            if refused is None:
                return
            key = (refused.uid, refused.generation)
            self._refused[key] = (desired.relative_field(refused.field), refused.message)
            log.warning("node %s refused %s/%s: %s", node, refused.namespace, refused.name,
                        refused.message)  # fmt: skip
            entries = [e for e in entries if e.uid != refused.uid]

    async def _push_once(
        self, swapnode: Body, entries: list[DesiredEntry], now: float, *, outrank: bool = True
    ) -> _Refusal | None:
        """One push. A push refused for its revision (the agent has seen a higher one:
        from before a leader Lease was deleted) raises the term above it, once, and is
        sent again (`_outrank`)."""
        address = AgentAddress.of(swapnode)
        node = str(swapnode["metadata"]["name"])
        previous = self._sent.get(node)
        if address is None:
            self._sent[node] = _Sent(entries, now, ok=False, error="its SwapNode names no endpoint")
            return None
        self._counter += 1
        body = DesiredSet(
            revision=desired.revision(self.current_term, self._counter),
            entries=tuple(entries),
            node_name=node,
        )
        try:
            client = await self.agents.for_node(address, self.tokens())
            result = await client.put_desired(body)
        except AgentError as e:
            outcome = type(e).__name__.removeprefix("Agent").lower()
            self.metrics.pushes.labels(outcome).inc()
            if (
                outrank
                and isinstance(e, AgentRefused)
                and e.status == 409
                and e.reason in OUTRANKED_REASONS
                and await self._outrank(address, node, e)
            ):
                return await self._push_once(swapnode, entries, now, outrank=False)
            if isinstance(e, AgentRefused) and e.status == 400:
                entry = desired.refused_entry(e.field, entries)
                if entry is not None:
                    return _Refusal(entry.uid, entry.generation, entry.namespace, entry.name,
                                    e.field or "", str(e))  # fmt: skip
            if previous is None or previous.error != str(e):
                log.warning("push to node %s failed: %s", node, e)
            self._sent[node] = _Sent(entries, now, ok=False, error=str(e))
            return None
        self.metrics.pushes.labels("ok").inc()
        results = {r.uid: r for r in result.results}
        for r in result.results:
            self.metrics.entry_results.labels(r.outcome).inc()
        if previous is None or not desired.same_entries(previous.entries, entries):
            log.info("node %s: pushed %d models (revision %s)", node, len(entries), body.revision)
        self._sent[node] = _Sent(entries, now, ok=True, results=results)
        return None

    async def _learn_terms(self, snap: Snapshot, live: set[str]) -> None:
        """Before this leader's first push: raise its term above every term the live
        nodes' agents have seen (`GET /v1/node`, side by side). A deleted leader Lease
        restarts `leaseTransitions` at 0, and pushes under it would all be refused. An
        agent that does not answer now is caught by `_outrank` at its first refusal."""
        semaphore = asyncio.Semaphore(self.settings.max_parallel_calls)

        async def seen(node: str) -> Revision | None:
            address = AgentAddress.of(snap.swapnodes[node])
            if address is None:
                return None
            async with semaphore:
                try:
                    client = await self.agents.for_node(address, self.tokens())
                    return (await client.node()).revision
                except AgentError as e:
                    log.info("node %s: cannot read the revision it has seen (%s)", node, e)
                    return None

        revisions = await asyncio.gather(*(seen(node) for node in sorted(live)))
        self._raise_term(revisions, "the agents have seen")
        self._terms_learned = True

    async def _outrank(self, address: AgentAddress, node: str, refusal: AgentRefused) -> bool:
        """After `node` refused a push for its revision: read the revision it has seen and,
        if this process still holds the leader Lease, raise the term above it. A deposed
        leader that has not noticed yet must not outrank its successor, hence the Lease
        read; answers whether the term went up (then the push is worth sending again)."""
        if self.confirm_leading is None:
            return False
        try:
            client = await self.agents.for_node(address, self.tokens())
            info = await client.node()
        except AgentError as e:
            log.warning("node %s refused a push (%s) and its revision cannot be read: %s",
                        node, refusal, e)  # fmt: skip
            return False
        if info.revision is None or not await self.confirm_leading():
            return False
        return self._raise_term([info.revision], f"node {node} has seen")

    def _raise_term(self, seen: list[Revision | None], what: str) -> bool:
        before = self.current_term
        try:
            term = terms.term_above(before, seen)
        except TermExhausted as e:
            log.error("cannot push above the revisions %s: %s", what, e)
            return False
        if term == before:
            return False
        self._term_floor = term
        log.info("pushing under term %d, above every term %s (the leader Lease's term is %d)",
                 term, what, self.term())  # fmt: skip
        return True

    async def _release_all(
        self, snap: Snapshot, live: set[str], reports: Mapping[str, Mapping[str, HostedModel]]
    ) -> None:
        deleting = {uid for uid, body in snap.deployments.items() if _deleting(body)}
        orphans = {
            uid for models in reports.values() for uid in models if uid not in snap.deployments
        }
        for uid in sorted(deleting | orphans):
            holders = {node for node in live if uid in reports[node]}
            assigned = self._assignments.pop(uid, None)
            if assigned is not None and assigned.node in live:
                holders.add(assigned.node)
            pending = [node for node in sorted(holders) if (node, uid) not in self._forgotten]
            for node in pending:
                await self._forget(snap.swapnodes[node], uid)
            if all((node, uid) in self._forgotten for node in holders):
                if uid in deleting and uid not in self._released:
                    body = snap.deployments[uid]
                    metadata = body["metadata"]
                    where = sorted(holders) or "no live node"
                    log.info("released %s/%s (%s) on %s", metadata.get("namespace"),
                             metadata.get("name"), uid, where)  # fmt: skip
                    await self._unroute(uid, body)
                self._released.add(uid)
                if (waiter := self._release_waiters.pop(uid, None)) is not None:
                    waiter.set()
        # Forget what no node reports any more, so the sets stay small.
        self._forgotten = {(n, u) for n, u in self._forgotten if n in live and u in reports[n]}

    async def _forget(self, swapnode: Body, uid: str) -> None:
        node = str(swapnode["metadata"]["name"])
        sent = self._sent.get(node)
        if sent is None or not sent.ok or any(e.uid == uid for e in sent.entries):
            return  # the node's accepted set still holds it (or we do not know): next turn
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

    async def _unroute(self, uid: str, body: Body) -> None:
        self._routed.pop(uid, None)
        self._route_keys.pop(uid, None)
        metadata = body["metadata"]
        try:
            await self.router.remove(metadata["namespace"], metadata["name"])
        except kube.KubeError as e:
            log.warning("removing the route of %s failed: %s", uid, e)

    async def _route_all(
        self, snap: Snapshot, verdicts: Mapping[str, Verdict], observed: Mapping[str, Observed]
    ) -> dict[str, tuple[bool, str | None]]:
        """(routed, problem) per placed uid. Models are routed side by side (each one's
        Service, then its EndpointSlice), as many at once as there are Kubernetes threads;
        a model whose route was ensured from the same inputs since the router last forgot
        is routed already."""
        routed: dict[str, tuple[bool, str | None]] = {}
        semaphore = asyncio.Semaphore(self.settings.kube_threads)
        gateways: dict[str, routing.Gateway | None] = {}

        async def one(uid: str, verdict: Verdict, ready: bool, key: tuple[Any, ...] | None) -> None:
            async with semaphore:
                await self._route(snap, uid, verdict, ready, routed, key=key)

        due = []
        for uid, verdict in verdicts.items():
            ready = uid in observed and serves(verdict, observed[uid])
            key = self._route_key(snap, uid, verdict, ready, gateways)
            if key is not None and self._route_keys.get(uid) == key:
                routed[uid] = (True, None)
            else:
                due.append(one(uid, verdict, ready, key))
        await asyncio.gather(*due)
        return routed

    def _route_key(
        self,
        snap: Snapshot,
        uid: str,
        verdict: Verdict,
        ready: bool,
        gateways: dict[str, routing.Gateway | None],
    ) -> tuple[Any, ...] | None:
        """Everything a placed model's Service and EndpointSlice are built from, and the
        router's generation; None when it has no route to ensure."""
        node = verdict.node
        if node is None:
            return None
        if node not in gateways:
            status = (snap.swapnodes.get(node) or {}).get("status") or {}
            gateways[node] = routing.Gateway.of_node(status)
        gateway = gateways[node]
        if gateway is None:
            return None
        body = snap.deployments[uid]
        metadata = body["metadata"]
        return (self.router.generation, metadata["namespace"], metadata["name"],
                body["apiVersion"], body["kind"], gateway, node, ready)  # fmt: skip

    async def _route(
        self,
        snap: Snapshot,
        uid: str,
        verdict: Verdict,
        ready: bool,
        routed: dict[str, tuple[bool, str | None]],
        *,
        key: tuple[Any, ...] | None,
    ) -> None:
        body = snap.deployments[uid]
        self._route_keys.pop(uid, None)
        if verdict.node is None:
            if uid in self._routed:
                await self._unroute(uid, body)
            return
        gateway = routing.Gateway.of_node(
            (snap.swapnodes.get(verdict.node) or {}).get("status") or {}
        )
        if gateway is None:
            routed[uid] = (False, f"node {verdict.node} reports no gateway endpoint")
            return
        metadata = body["metadata"]
        owner = {"apiVersion": body["apiVersion"], "kind": body["kind"],
                 "name": metadata["name"], "uid": uid}  # fmt: skip
        try:
            await self.router.ensure(
                metadata["namespace"], owner, gateway, verdict.node, ready=ready,
                new=uid not in self._routed and not (body.get("status") or {}).get("endpoint"),
            )  # fmt: skip
        except routing.RouteError as e:
            routed[uid] = (False, str(e))
            return
        except kube.KubeError as e:
            self.router.forget()
            routed[uid] = (False, f"writing the Service or EndpointSlice failed: {e}")
            return
        self._routed[uid] = (metadata["namespace"], metadata["name"])
        if key is not None and key[0] == self.router.generation:
            self._route_keys[uid] = key
        routed[uid] = (True, None)

    async def _write_statuses(
        self,
        *,
        snap: Snapshot,
        verdicts: Mapping[str, Verdict],
        observed: Mapping[str, Observed],
        routed: Mapping[str, tuple[bool, str | None]],
    ) -> None:
        """Each changed status is written (one patch per object, then its Events), side by
        side, as many at once as there are Kubernetes threads."""
        stamp = datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        semaphore = asyncio.Semaphore(self.settings.kube_threads)
        writes = []
        for uid, body in snap.deployments.items():
            deleting = _deleting(body)
            if deleting and uid in self._released:
                continue  # the finalizer is about to go: nothing more to say
            metadata = body["metadata"]
            verdict = verdicts.get(uid, Verdict(reason="Deleting", message="being deleted"))
            is_routed, route_error = routed.get(uid, (False, None))
            seen = dataclasses.replace(
                observed.get(uid) or Observed(), routed=is_routed, route_error=route_error
            )
            previous = self._statuses.get(uid) or body.get("status")
            generation = int(metadata.get("generation") or 1)
            inputs = (generation, deleting, verdict, seen)
            last = self._status_inputs.get(uid)
            if last is not None and last[1] is previous and last[0] == inputs:
                continue  # built from the same inputs over the same status: unchanged
            status = build_status(
                model_name=_model_name(body),
                generation=generation,
                deleting=deleting,
                verdict=verdict,
                observed=seen,
                previous=previous,
                now=stamp,
            )
            if not status_changed(status, previous):
                self._status_inputs[uid] = (inputs, previous)
                continue
            writes.append(self._write_status(uid, body, status, previous, inputs, semaphore))
        await asyncio.gather(*writes)
        for uid in set(self._statuses) - set(snap.deployments):
            del self._statuses[uid]
        for uid in set(self._status_inputs) - set(snap.deployments):
            del self._status_inputs[uid]
        for uid in set(self._model_generations) - set(snap.deployments):
            del self._model_generations[uid]
        self._refused = {
            key: why for key, why in self._refused.items() if key[0] in snap.deployments
        }

    async def _write_status(  # noqa: PLR0917 - one call site
        self,
        uid: str,
        body: Body,
        status: dict[str, Any],
        previous: Mapping[str, Any] | None,
        inputs: Any,
        semaphore: asyncio.Semaphore,
    ) -> None:
        metadata = body["metadata"]
        namespace, name = str(metadata.get("namespace") or ""), str(metadata["name"])
        patch = {key: None for key in (previous or {}) if key not in status} | status
        async with semaphore:
            try:
                await self.io.call(
                    kube.patch_model_deployment_status, namespace, name, {"status": patch}
                )
            except kube.NotFound:
                return
            except kube.KubeError as e:
                self.metrics.status_writes.labels("failed").inc()
                log.warning("status of %s/%s: %s", namespace, name, e)
                return
            self.metrics.status_writes.labels("ok").inc()
            self._statuses[uid] = status
            self._status_inputs[uid] = (inputs, status)
            for note in events_between(previous, status):
                await self.events.post(body, note.type, note.reason, note.message)

    def _observe_all(
        self,
        snap: Snapshot,
        verdicts: Mapping[str, Verdict],
        live: set[str],
        reports: Mapping[str, Mapping[str, HostedModel]],
    ) -> dict[str, Observed]:
        """What the cluster and each placed model's node say of it (its routing is added
        once it is routed: the EndpointSlice's `ready` is decided from the rest)."""
        found = {}
        for uid, verdict in verdicts.items():
            node = verdict.node
            body = snap.deployments.get(uid)
            if node is None or body is None:
                continue
            metadata = body["metadata"]
            sent = self._sent.get(node)
            try:
                endpoint = routing.endpoint_name(str(metadata.get("namespace") or ""),
                                                 str(metadata["name"]))  # fmt: skip
            except routing.RouteError:
                endpoint = None
            previous = self._statuses.get(uid) or body.get("status") or {}
            was_ready = previous.get("node") == node and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in previous.get("conditions") or ()
            )
            model_generation = self._model_generations.get(uid)
            found[uid] = Observed(
                model_digest=model_generation[0] if model_generation else None,
                model_generation=model_generation[1] if model_generation else None,
                was_ready=was_ready,
                node_live=node in live,
                hosted=(reports.get(node) or {}).get(uid),
                push=sent.results.get(uid) if sent is not None and sent.ok else None,
                agent_error=sent.error if sent is not None and not sent.ok else None,
                endpoint=endpoint,
            )
        return found

    # -- SwapNodes and their Leases ----------------------------------------------------------------

    def _with_departed(self, snap: Snapshot, now: float) -> Snapshot:
        """`snap` with each deleted SwapNode whose node's Lease is still fresh put back
        (the node is alive and its agent creates it again); the others are forgotten."""
        kept, gone = {}, []
        for name, body in snap.departed.items():
            if name in snap.swapnodes:
                continue
            lost = lost_since(snap.leases.get(name), self.settings.grace_seconds)
            if lost is not None and now <= lost:
                kept[name] = body
            else:
                gone.append(name)
        self.cache.forget_departed(gone)
        if not kept:
            return snap
        return dataclasses.replace(snap, swapnodes={**snap.swapnodes, **kept})

    async def _keep_swapnodes(self, snap: Snapshot, live: set[str], now: float) -> None:
        """Label each SwapNode with its Lease's state; delete those lost for longer than
        `dead_node_retention_seconds` (only the version seen lost: one its agent wrote
        meanwhile stays)."""
        retention = self.settings.dead_node_retention_seconds
        for name in [n for n in self._unleased_since if n not in snap.swapnodes]:
            del self._unleased_since[name]
        for name in [n for n in self._lease_labels if n not in snap.swapnodes]:
            del self._lease_labels[name]
        for name, body in sorted(snap.swapnodes.items()):
            if name in snap.departed:
                continue  # deleted already; its agent creates it again
            metadata = body.get("metadata") or {}
            if name in live:
                self._unleased_since.pop(name, None)
                want = LEASE_LIVE
            else:
                lease = snap.leases.get(name)
                since = lost_since(lease, self.settings.grace_seconds)
                if since is None:
                    since = self._unleased_since.setdefault(name, now)
                if now - since >= retention:
                    await self._delete_swapnode(name, metadata, now - since)
                    continue
                want = LEASE_EXPIRED
            version = metadata.get("resourceVersion")
            labelled = (metadata.get("labels") or {}).get(LEASE_LABEL) == want
            if (
                not labelled
                and self._lease_labels.get(name) != (version, want)
                and await self._label_swapnode(name, want)
            ):
                self._lease_labels[name] = (version, want)

    async def _label_swapnode(self, name: str, value: str) -> bool:
        """Whether the label was written."""
        try:
            await self.io.call(
                kube.patch_swapnode, name, {"metadata": {"labels": {LEASE_LABEL: value}}}
            )
        except kube.NotFound:
            return False
        except kube.KubeError as e:
            if name not in self._lease_label_refused:
                self._lease_label_refused.add(name)
                log.warning("SwapNode %s: cannot label it %s=%s: %s", name, LEASE_LABEL, value, e)
            return False
        self._lease_label_refused.discard(name)
        if value == LEASE_EXPIRED:
            log.info("SwapNode %s: its node's Lease is stale (deleted after %g s more)",
                     name, self.settings.dead_node_retention_seconds)  # fmt: skip
        return True

    async def _delete_swapnode(
        self, name: str, metadata: Mapping[str, Any], lost_seconds: float
    ) -> None:
        try:
            deleted = await self.io.call(
                kube.delete_swapnode, name, resource_version=metadata.get("resourceVersion")
            )
        except kube.Conflict:
            return  # written meanwhile (its agent is back?): judged again next turn
        except kube.KubeError as e:
            if name not in self._lease_label_refused:
                self._lease_label_refused.add(name)
                log.warning("SwapNode %s: cannot delete it: %s", name, e)
            return
        self._unleased_since.pop(name, None)
        if deleted:
            log.info("deleted SwapNode %s: its node's Lease has been stale for %.0f s",
                     name, lost_seconds)  # fmt: skip


def _with_problem(verdict: Verdict, reason: str, field_path: str, message: str) -> Verdict:
    return Verdict(
        node=verdict.node,
        gpu=verdict.gpu,
        policy=verdict.policy,
        reason=reason,
        message=message,
        problem_field=field_path,
        policy_invalid=False,
    )
