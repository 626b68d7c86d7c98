"""What one turn does, decided without I/O: pure functions from what the turn read (the
cache's snapshot, the live nodes, what each node reports) and what was done before (the
executors' memos, handed in read-only) to frozen plans the executors carry out.

A turn's later decisions depend on the outcome of its earlier writes (a model is released
only once its nodes forgot it; a status says what this turn's push and route answered), so
the turn is planned in stages, each planned from what the previous stage's executor
recorded:

1. `plan_swapnodes`: the Lease label each SwapNode should carry, and which lost ones to
   delete (`swapnode_keeping` carries it out);
2. placements: `planner.plan_views` (`placing`), then `entry_plan.plan_entries`: each
   live node's desired set, from the credentials Secrets `entry_plan.secrets_wanted`
   names (`entry_building` reads them);
3. `plan_pushes`: which sets are due (`pushing`);
4. `plan_releases`: which nodes to ask to forget which deleted or orphaned models
   (`releasing`);
5. `plan_routes`: which Services and EndpointSlices to ensure or remove
   (`route_keeping`);
6. `plan_statuses`: each status patch, with its Events (`status_writing`).
Equal inputs give equal plans; a stage planned again over the memo its executor recorded
plans nothing more (no repeated push, label or status write)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from modelswap_api.control import DesiredEntry, EntryResult
from modelswap_api.models import HostedModel
from modelswap_operator import desired, routing
from modelswap_operator.cache import Body, Snapshot
from modelswap_operator.planning.results import Assignment
from modelswap_operator.reading import deleting, lost_since, model_name
from modelswap_operator.status import Observed, Verdict, build_status, serves
from modelswap_operator.status_events import EventNote, events_between, status_changed

#: The SwapNode label the operator keeps to its node's Lease (the `Lease` printer column).
LEASE_LABEL = "modelswap.io/lease"
LEASE_LIVE = "Live"
LEASE_EXPIRED = "Expired"


# -- 1. SwapNodes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabelSwapNode:
    name: str
    value: str
    #: The resourceVersion it is labelled over (remembered once written).
    version: Any


@dataclass(frozen=True)
class DeleteSwapNode:
    name: str
    #: Only this version is deleted: one its agent wrote meanwhile stays.
    version: Any
    lost_seconds: float


@dataclass(frozen=True)
class SwapNodePlan:
    actions: tuple[LabelSwapNode | DeleteSwapNode, ...]
    #: The memo after this turn: when each SwapNode without any Lease was first seen.
    unleased_since: Mapping[str, float]
    #: The memo of labels written, less the SwapNodes gone.
    labels: Mapping[str, tuple[Any, str]]


def plan_swapnodes(
    snap: Snapshot,
    live: Collection[str],
    now: float,
    *,
    grace_seconds: float,
    retention_seconds: float,
    unleased_since: Mapping[str, float],
    labels: Mapping[str, tuple[Any, str]],
) -> SwapNodePlan:
    """Label each SwapNode with its Lease's state (unless it carries it, or it was written
    over this very version); delete those lost for `retention_seconds` or longer. A
    SwapNode with no Lease at all counts as lost from when it was first seen."""
    since_memo = {n: t for n, t in unleased_since.items() if n in snap.swapnodes}
    labels_memo = {n: v for n, v in labels.items() if n in snap.swapnodes}
    actions: list[LabelSwapNode | DeleteSwapNode] = []
    for name, body in sorted(snap.swapnodes.items()):
        if name in snap.departed:
            continue  # deleted already; its agent creates it again
        metadata = body.get("metadata") or {}
        version = metadata.get("resourceVersion")
        if name in live:
            since_memo.pop(name, None)
            want = LEASE_LIVE
        else:
            since = lost_since(snap.leases.get(name), grace_seconds)
            if since is None:
                since = since_memo.setdefault(name, now)
            if now - since >= retention_seconds:
                actions.append(DeleteSwapNode(name, version, now - since))
                continue
            want = LEASE_EXPIRED
        labelled = (metadata.get("labels") or {}).get(LEASE_LABEL) == want
        if not labelled and labels_memo.get(name) != (version, want):
            actions.append(LabelSwapNode(name, want, version))
    return SwapNodePlan(tuple(actions), since_memo, labels_memo)


# -- 3. pushes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """The last set pushed to a node and how it went."""

    entries: list[DesiredEntry]
    at: float
    ok: bool
    error: str | None = None
    results: Mapping[str, EntryResult] = dataclasses.field(default_factory=dict)


def push_due(sent: Sent | None, entries: list[DesiredEntry], now: float, interval: float) -> bool:
    """A set is pushed when it changed, when the last push failed, or every `interval`."""
    return (
        sent is None
        or not sent.ok
        or not desired.same_entries(sent.entries, entries)
        or now - sent.at >= interval
    )


def plan_pushes(
    live: Collection[str],
    entries: Mapping[str, list[DesiredEntry]],
    sent: Mapping[str, Sent],
    now: float,
    interval_seconds: float,
) -> dict[str, list[DesiredEntry]]:
    """The sets due, by live node (in name order)."""
    return {
        node: entries[node]
        for node in sorted(live)
        if push_due(sent.get(node), entries[node], now, interval_seconds)
    }


# -- 4. releases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """A uid no ModelDeployment wants any more (deleted, or unknown and still reported)."""

    uid: str
    #: Its ModelDeployment is being deleted (False: an orphan some node reports).
    deleting: bool
    #: The live nodes that hold it (report it, or were assigned it).
    holders: frozenset[str]
    #: The holders to ask now: not asked successfully before, and whose accepted set no
    #: longer holds it (a node still told to hold it would refuse: `StillDesired`).
    forget_on: tuple[str, ...]


def accepted_without(sent: Sent | None, uid: str) -> bool:
    """The node's last accepted set is known and does not hold `uid`."""
    return sent is not None and sent.ok and not any(e.uid == uid for e in sent.entries)


def plan_releases(
    deployments: Mapping[str, Body],
    live: Collection[str],
    reports: Mapping[str, Mapping[str, HostedModel]],
    *,
    assignments: Mapping[str, Assignment],
    sent: Mapping[str, Sent],
    forgotten: Collection[tuple[str, str]],
) -> tuple[Release, ...]:
    """Every uid to release, by uid."""
    gone = {uid for uid, body in deployments.items() if deleting(body)}
    orphans = {uid for models in reports.values() for uid in models if uid not in deployments}
    releases = []
    for uid in sorted(gone | orphans):
        holders = {node for node in live if uid in reports[node]}
        assigned = assignments.get(uid)
        if assigned is not None and assigned.node in live:
            holders.add(assigned.node)
        forget_on = tuple(
            node
            for node in sorted(holders)
            if (node, uid) not in forgotten and accepted_without(sent.get(node), uid)
        )
        releases.append(Release(uid, uid in gone, frozenset(holders), forget_on))
    return tuple(releases)


# -- 5. routes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnsureRoute:
    uid: str
    namespace: str
    owner: Mapping[str, Any]
    gateway: routing.Gateway
    node: str
    ready: bool
    #: Neither this process nor the status knows of a route: create without reading first.
    new: bool
    #: What it is built from (and the router's generation): remembered once ensured.
    key: tuple[Any, ...]


@dataclass(frozen=True)
class RoutePlan:
    #: Placed uids whose route was ensured from the same inputs: routed already.
    routed: tuple[str, ...]
    ensure: tuple[EnsureRoute, ...]
    #: Unplaced uids whose route this process made: removed.
    unroute: tuple[str, ...]
    #: Placed uids that cannot be routed, and why.
    problems: Mapping[str, str]


def route_key(  # noqa: PLR0917 - the route's parts
    snap: Snapshot, uid: str, node: str, gateway: routing.Gateway, ready: bool, generation: int
) -> tuple[Any, ...]:
    """Everything a placed model's Service and EndpointSlice are built from, and the
    router's generation."""
    body = snap.deployments[uid]
    metadata = body["metadata"]
    return (generation, metadata["namespace"], metadata["name"],
            body["apiVersion"], body["kind"], gateway, node, ready)  # fmt: skip


def plan_routes(
    snap: Snapshot,
    verdicts: Mapping[str, Verdict],
    observed: Mapping[str, Observed],
    *,
    generation: int,
    keys: Mapping[str, tuple[Any, ...]],
    routed: Collection[str],
) -> RoutePlan:
    """Each placed model's route, its endpoint `ready` exactly when `serves`; a model whose
    route was ensured from the same inputs since the router last forgot needs nothing."""
    already, ensure, unroute, problems = [], [], [], {}
    gateways: dict[str, routing.Gateway | None] = {}
    for uid, verdict in verdicts.items():
        node = verdict.node
        if node is None:
            if uid in routed:
                unroute.append(uid)
            continue
        if node not in gateways:
            status = (snap.swapnodes.get(node) or {}).get("status") or {}
            gateways[node] = routing.Gateway.of_node(status)
        gateway = gateways[node]
        if gateway is None:
            problems[uid] = f"node {node} reports no gateway endpoint"
            continue
        ready = uid in observed and serves(verdict, observed[uid])
        key = route_key(snap, uid, node, gateway, ready, generation)
        if keys.get(uid) == key:
            already.append(uid)
            continue
        body = snap.deployments[uid]
        metadata = body["metadata"]
        owner = {"apiVersion": body["apiVersion"], "kind": body["kind"],
                 "name": metadata["name"], "uid": uid}  # fmt: skip
        new = uid not in routed and not (body.get("status") or {}).get("endpoint")
        ensure.append(EnsureRoute(uid, metadata["namespace"], owner, gateway, node, ready,
                                  new, key))  # fmt: skip
    return RoutePlan(tuple(already), tuple(ensure), tuple(unroute), problems)


# -- 6. statuses -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusPatch:
    uid: str
    body: Body
    status: dict[str, Any]
    previous: Mapping[str, Any] | None
    #: What it was built from (remembered once written).
    inputs: Any
    #: The Events its changes deserve, posted once it is written.
    events: tuple[EventNote, ...]

    @property
    def patch(self) -> dict[str, Any]:
        """The merge patch: the new status, and None for each key it no longer has."""
        return {key: None for key in (self.previous or {}) if key not in self.status} | (
            self.status
        )


@dataclass(frozen=True)
class StatusPlan:
    writes: tuple[StatusPatch, ...]
    #: Per uid built to no change: (its inputs, the status in effect), remembered so the
    #: same inputs over the same status are not built again.
    unchanged: Mapping[str, tuple[Any, Mapping[str, Any] | None]]


def plan_statuses(
    deployments: Mapping[str, Body],
    verdicts: Mapping[str, Verdict],
    observed: Mapping[str, Observed],
    routed: Mapping[str, tuple[bool, str | None]],
    *,
    written: Mapping[str, Mapping[str, Any]],
    built_from: Mapping[str, tuple[Any, Mapping[str, Any] | None]],
    released: Collection[str],
    stamp: str,
) -> StatusPlan:
    """Each known ModelDeployment's status, patched when it changed; `written`: the status
    this process last wrote per uid (the watch may not have brought it yet)."""
    writes, unchanged = [], {}
    for uid, body in deployments.items():
        is_deleting = deleting(body)
        if is_deleting and uid in released:
            continue  # the finalizer is about to go: nothing more to say
        metadata = body["metadata"]
        verdict = verdicts.get(uid, Verdict(reason="Deleting", message="being deleted"))
        is_routed, route_error = routed.get(uid, (False, None))
        seen = dataclasses.replace(
            observed.get(uid) or Observed(), routed=is_routed, route_error=route_error
        )
        previous = written.get(uid) or body.get("status")
        generation = int(metadata.get("generation") or 1)
        inputs = (generation, is_deleting, verdict, seen)
        last = built_from.get(uid)
        if last is not None and last[1] is previous and last[0] == inputs:
            continue  # built from the same inputs over the same status: unchanged
        status = build_status(
            model_name=model_name(body),
            generation=generation,
            deleting=is_deleting,
            verdict=verdict,
            observed=seen,
            previous=previous,
            now=stamp,
        )
        if not status_changed(status, previous):
            unchanged[uid] = (inputs, previous)
            continue
        events = tuple(events_between(previous, status))
        writes.append(StatusPatch(uid, body, status, previous, inputs, events))
    return StatusPlan(tuple(writes), unchanged)
