"""Property tests of the operator's pure turn plans (`turn_plan`; hypothesis, derandomized:
the same cases every run), over random snapshots and memos of earlier turns.

Checked: equal inputs give equal plans; no push to, forget on or label of a node the plan
must not touch (pushes and forgets only on live nodes, no Live label on a lost node, no
SwapNode deleted before its retention); a model a ModelDeployment still wants is never
released and a node is asked to forget a model only once its accepted set lacks it;
statuses only for known ModelDeployments; and idempotence: each stage planned again over
the memo its executor records after carrying the plan out plans no repeated push, forget,
label, route or status write."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelswap_api.control import DesiredEntry, EntryResult
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import HostedModel, ModelDeployment, ModelDeploymentSpec
from modelswap_api.policy import effective_policy
from modelswap_operator.cache import Snapshot
from modelswap_operator.entry_plan import plan_entries, secrets_wanted
from modelswap_operator.errors import CredentialsNotPermitted
from modelswap_operator.observing import observe_all
from modelswap_operator.planning.results import Assignment
from modelswap_operator.reading import live_nodes, lost_since
from modelswap_operator.status import Verdict
from modelswap_operator.turn_plan import (
    LEASE_LABEL,
    LEASE_LIVE,
    DeleteSwapNode,
    LabelSwapNode,
    Sent,
    plan_pushes,
    plan_releases,
    plan_routes,
    plan_statuses,
    plan_swapnodes,
)

pytestmark = pytest.mark.timeout(120)

CASES = settings(
    max_examples=80,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
START = datetime(2026, 11, 27, 15, 0, tzinfo=UTC).timestamp()
GRACE_SECONDS = 90.0
RETENTION_SECONDS = 600.0
INTERVAL_SECONDS = 30.0
STAMP = "2026-11-27T15:00:00Z"
SPEC = {"model": {"runtime": "triton", "source": {"uri": "/models/mlp"}, "weightsBytes": "1Gi"}}
POLICY = effective_policy(SPEC, BUILTIN_DEFAULTS)
UIDS = [f"00000000-0000-4000-8000-{i:012d}" for i in range(5)]
ORPHANS = ["orphan-a", "orphan-b"]


def entry(uid: str, generation: int = 1) -> DesiredEntry:
    return DesiredEntry(uid=uid, namespace="ns", name=f"m-{uid}", generation=generation,
                        spec=ModelDeploymentSpec.from_dict(SPEC), policy=POLICY.to_status())  # fmt: skip


def renewed(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True)
class World:
    snap: Snapshot
    now: float
    live: frozenset[str]
    reports: dict[str, dict[str, HostedModel]]
    verdicts: dict[str, Verdict]
    entries: dict[str, list[DesiredEntry]]
    sent: dict[str, Sent]
    assignments: dict[str, Assignment]
    forgotten: frozenset[tuple[str, str]]
    routed: dict[str, tuple[bool, str | None]]
    unleased_since: dict[str, float]


@st.composite
def worlds(draw: st.DrawFn) -> World:
    now = START + draw(st.sampled_from([0.0, 100.0, 700.0]))
    names = [f"node-{i}" for i in range(draw(st.integers(1, 4)))]
    swapnodes, leases, departed = {}, {}, {}
    for i, name in enumerate(names):
        metadata: dict[str, Any] = {"name": name, "resourceVersion": draw(st.sampled_from("12"))}
        label = draw(st.sampled_from([None, "Live", "Expired"]))
        if label is not None:
            metadata["labels"] = {LEASE_LABEL: label}
        status: dict[str, Any] = {}
        if draw(st.booleans()):
            status["gatewayEndpoint"] = f"http://10.0.0.{i}:8080"
        swapnodes[name] = {"metadata": metadata, "status": status}
        age = draw(st.sampled_from([0.0, 0.0, 60.0, None, 200.0, 500.0, 689.0, 690.0, 1000.0]))
        if age is not None:
            leases[name] = {"metadata": {"name": name}, "spec": {"renewTime": renewed(now - age)}}
        if draw(st.integers(0, 5)) == 0:
            departed[name] = swapnodes[name]
    deployments = {}
    for uid in draw(st.lists(st.sampled_from(UIDS), unique=True, max_size=5)):
        metadata = {"name": f"m-{uid}", "namespace": "ns", "uid": uid, "generation": 1}
        if draw(st.booleans()) and draw(st.booleans()):
            metadata["deletionTimestamp"] = STAMP
        body: dict[str, Any] = {"apiVersion": "modelswap.io/v1alpha1",
                                "kind": "ModelDeployment", "metadata": metadata}  # fmt: skip
        if draw(st.booleans()):
            body["status"] = {"endpoint": f"m-{uid}.ns.svc"}
        deployments[uid] = body
    snap = Snapshot(deployments=deployments, swapnodes=swapnodes, leases=leases,
                    departed=departed)  # fmt: skip
    live = frozenset(live_nodes(swapnodes, leases, now, GRACE_SECONDS))
    reports = {
        node: {uid: HostedModel(uid=uid, state=draw(st.sampled_from(["Resident", "SwappedOut"])))
               for uid in draw(st.lists(st.sampled_from(UIDS + ORPHANS), unique=True))}
        for node in sorted(live)
    }  # fmt: skip
    verdicts: dict[str, Verdict] = {}
    entries: dict[str, list[DesiredEntry]] = {node: [] for node in sorted(live)}
    assignments = {}
    for uid, body in deployments.items():
        if body["metadata"].get("deletionTimestamp"):
            continue
        node = draw(st.sampled_from([None, *names]))
        verdicts[uid] = Verdict(node=node, gpu="g0" if node else None, policy=POLICY,
                                reason="Placed" if node else "InsufficientCapacity")  # fmt: skip
        if node is not None:
            assignments[uid] = Assignment(node=node, gpu="g0")
            if node in live:
                entries[node].append(entry(uid))
    sent = {}
    for node in sorted(live):
        if draw(st.booleans()):
            held = draw(st.lists(st.sampled_from(UIDS), unique=True))
            ok = draw(st.booleans())
            sent[node] = Sent(
                [entry(uid) for uid in held], now - draw(st.sampled_from([0.0, 10.0, 40.0])), ok,
                error=None if ok else "refused",
                results={uid: EntryResult(uid=uid, outcome="applied", reason="Loading")
                         for uid in held},
            )  # fmt: skip
    forgotten = frozenset(
        (node, uid) for node in sorted(live) for uid in reports[node] if draw(st.booleans())
    )
    routed: dict[str, tuple[bool, str | None]] = {
        uid: (draw(st.booleans()), None) for uid in verdicts
    }
    # a node's memo may predate its Lease (created since): a live node drops it
    unleased = {name: now - draw(st.sampled_from([0.0, 400.0, 600.0, 700.0])) for name in names
                if draw(st.booleans())}  # fmt: skip
    return World(snap, now, live, reports, verdicts, entries, sent, assignments, forgotten,
                 routed, unleased)  # fmt: skip


def swapnode_plan(world: World, **memo: Any) -> Any:
    memo.setdefault("unleased_since", world.unleased_since)
    memo.setdefault("labels", {})
    return plan_swapnodes(world.snap, world.live, world.now, grace_seconds=GRACE_SECONDS,
                          retention_seconds=RETENTION_SECONDS, **memo)  # fmt: skip


@CASES
@given(worlds())
def test_swapnodes_are_labelled_to_their_leases_and_deleted_only_after_the_retention(
    world: World,
) -> None:
    plan = swapnode_plan(world)
    assert plan == swapnode_plan(world)
    for action in plan.actions:
        assert action.name in world.snap.swapnodes and action.name not in world.snap.departed
        if isinstance(action, DeleteSwapNode):
            assert action.name not in world.live
            since = lost_since(world.snap.leases.get(action.name), GRACE_SECONDS)
            if since is None:
                since = plan.unleased_since[action.name]
            assert world.now - since >= RETENTION_SECONDS
            assert action.lost_seconds == world.now - since
        else:
            assert (action.value == LEASE_LIVE) == (action.name in world.live)
    assert not set(plan.unleased_since) & (world.live - set(world.snap.departed))
    deleted = {a.name for a in plan.actions if isinstance(a, DeleteSwapNode)}
    for name in set(world.snap.swapnodes) - world.live - set(world.snap.departed):
        since = lost_since(world.snap.leases.get(name), GRACE_SECONDS)
        since = plan.unleased_since[name] if since is None else since
        assert (name in deleted) == (world.now - since >= RETENTION_SECONDS)
    # the executor records each label written: planned again, nothing is labelled twice
    labels = dict(plan.labels)
    for action in plan.actions:
        if isinstance(action, LabelSwapNode):
            labels[action.name] = (action.version, action.value)
    again = swapnode_plan(world, unleased_since=plan.unleased_since, labels=labels)
    assert not [a for a in again.actions if isinstance(a, LabelSwapNode)]
    assert [a for a in again.actions if isinstance(a, DeleteSwapNode)] == [
        a for a in plan.actions if isinstance(a, DeleteSwapNode)
    ]


@CASES
@given(worlds())
def test_pushes_go_only_to_live_nodes_and_are_not_repeated(world: World) -> None:
    due = plan_pushes(world.live, world.entries, world.sent, world.now, INTERVAL_SECONDS)
    assert due == plan_pushes(world.live, world.entries, world.sent, world.now, INTERVAL_SECONDS)
    assert set(due) <= world.live
    for node in world.live - set(due):  # not due: the same set, accepted within the interval
        sent = world.sent[node]
        assert sent.ok and world.now - sent.at < INTERVAL_SECONDS
        assert sorted(e.uid for e in sent.entries) == sorted(e.uid for e in world.entries[node])
    recorded = dict(world.sent) | {node: Sent(entries, world.now, ok=True)
                                   for node, entries in due.items()}  # fmt: skip
    assert plan_pushes(world.live, world.entries, recorded, world.now, INTERVAL_SECONDS) == {}


def release_plan(world: World, forgotten: frozenset[tuple[str, str]]) -> Any:
    return plan_releases(world.snap.deployments, world.live, world.reports,
                         assignments=world.assignments, sent=world.sent,
                         forgotten=forgotten)  # fmt: skip


@CASES
@given(worlds())
def test_only_unwanted_models_are_released_and_only_where_no_longer_desired(
    world: World,
) -> None:
    plan = release_plan(world, world.forgotten)
    assert plan == release_plan(world, world.forgotten)
    wanted = {uid for uid, b in world.snap.deployments.items()
              if not b["metadata"].get("deletionTimestamp")}  # fmt: skip
    for release in plan:
        assert release.uid not in wanted
        assert release.deleting == (release.uid in world.snap.deployments)
        assert release.holders <= world.live
        assert {n for n in world.live if release.uid in world.reports[n]} <= release.holders
        for node in release.forget_on:
            assert node in release.holders and (node, release.uid) not in world.forgotten
            sent = world.sent[node]
            assert sent.ok and release.uid not in {e.uid for e in sent.entries}
    reported_unwanted = {uid for n in world.live for uid in world.reports[n]} - wanted
    assert reported_unwanted <= {release.uid for release in plan}
    # every forget asked succeeded: planned again, no node is asked twice
    done = world.forgotten | {(n, r.uid) for r in plan for n in r.forget_on}
    assert all(not release.forget_on for release in release_plan(world, done))


def observed(world: World) -> Any:
    return observe_all(world.snap, world.verdicts, set(world.live), world.reports,
                       sent=world.sent.get, status_of=lambda uid, body: (body or {}).get("status"),
                       model_generation=lambda uid: None)  # fmt: skip


@CASES
@given(worlds())
def test_routes_are_ensured_once_from_the_same_inputs(world: World) -> None:
    seen = observed(world)
    routed_uids = {uid for uid, (yes, _) in world.routed.items() if yes}

    def plan(keys: dict[str, Any]) -> Any:
        return plan_routes(world.snap, world.verdicts, seen, generation=1, keys=keys,
                           routed=routed_uids)  # fmt: skip

    first = plan({})
    assert first == plan({})
    for route in first.ensure:
        verdict = world.verdicts[route.uid]
        assert route.node == verdict.node and route.node is not None
        assert (world.snap.swapnodes[route.node].get("status") or {}).get("gatewayEndpoint")
    for uid in first.unroute:
        assert world.verdicts[uid].node is None and uid in routed_uids
    placed = {uid for uid, v in world.verdicts.items() if v.node is not None}
    assert {r.uid for r in first.ensure} | set(first.problems) == placed
    again = plan({route.uid: route.key for route in first.ensure})
    assert again.ensure == () and set(again.routed) == {r.uid for r in first.ensure}


@CASES
@given(worlds(), st.frozensets(st.sampled_from(UIDS)))
def test_statuses_only_for_known_models_and_not_written_twice(
    world: World, released: frozenset[str]
) -> None:
    seen = observed(world)

    def plan(written: dict[str, Any], built: dict[str, Any]) -> Any:
        return plan_statuses(world.snap.deployments, world.verdicts, seen, world.routed,
                             written=written, built_from=built, released=released,
                             stamp=STAMP)  # fmt: skip

    first = plan({}, {})
    assert first == plan({}, {})
    for patch in first.writes:
        body = world.snap.deployments[patch.uid]
        assert not (body["metadata"].get("deletionTimestamp") and patch.uid in released)
        assert patch.status["observedGeneration"] == 1
        assert all(patch.patch[key] is None for key in patch.previous or {}
                   if key not in patch.status)  # fmt: skip
    assert {p.uid for p in first.writes} | set(first.unchanged) <= set(world.snap.deployments)
    # the executor records each status written and each built to no change
    written = {p.uid: p.status for p in first.writes}
    built = dict(first.unchanged) | {p.uid: (p.inputs, p.status) for p in first.writes}
    again = plan(written, built)
    assert again.writes == () and not again.unchanged


def model(uid: str, body: Mapping[str, Any], secret_ref: bool) -> ModelDeployment:
    spec = dict(SPEC, model=dict(SPEC["model"]))
    if secret_ref:
        spec["model"]["source"] = {"uri": "https://models.example/m.tar.gz",
                                   "credentialsSecretRef": {"name": f"hub-{uid[-1]}"}}  # fmt: skip
    return ModelDeployment.from_dict({**body, "spec": spec})


SECRETS: list[Any] = [
    {"data": {"authorization": base64.b64encode(b"Bearer t").decode()}},
    None,  # deleted
    {"data": {}},  # without its key
    CredentialsNotPermitted("namespace ns did not opt in"),
]


@CASES
@given(worlds(), st.data())
def test_entries_go_to_their_placed_node_once_and_never_a_refused_generation(
    world: World, data: st.DataObject
) -> None:
    active = [  # every other model names a credentials Secret
        model(uid, body, secret_ref=int(uid[-1]) % 2 == 0)
        for uid, body in world.snap.deployments.items()
        if not body["metadata"].get("deletionTimestamp")
    ]
    nodes = st.sampled_from([*sorted(world.live), None])
    verdicts = {}  # placed on live nodes only, as the planner does
    for deployment in active:
        node = data.draw(nodes)
        verdicts[str(deployment.metadata["uid"])] = Verdict(
            node=node, gpu="g0" if node else None, policy=POLICY, reason="Placed"
        )
    wanted = secrets_wanted(active, verdicts)
    assert len(wanted) == len(set(wanted))
    secrets = {key: data.draw(st.sampled_from(SECRETS)) for key in wanted}
    refusals = {
        (uid, 1): ("spec.model", "refused")
        for uid in data.draw(st.frozensets(st.sampled_from(UIDS)))
    }

    def plan(sent: Mapping[str, tuple[str, int]]) -> Any:
        return plan_entries(world.live, active, verdicts, world.reports, world.snap.deployments,
                            secrets=secrets, written={}, model_generations_sent=sent,
                            refusals=refusals)  # fmt: skip

    first = plan({})
    assert first == plan({})
    assert set(first.by_node) == world.live
    sent = [e.uid for entries in first.by_node.values() for e in entries]
    assert len(sent) == len(set(sent))
    by_uid = {str(m.metadata["uid"]): m for m in active}
    for node, entries in first.by_node.items():
        for e in entries:
            assert verdicts[e.uid].node == node and (e.uid, e.generation) not in refusals
            reference = by_uid[e.uid].spec.model.source.credentials_secret_ref
            if reference is None:
                continue
            usable = secrets[("ns", reference.name)] is SECRETS[0]
            assert (e.credentials is not None) == usable
            if not usable:  # sent without credentials only while its node holds it
                assert e.uid in world.reports[node]
                assert first.verdicts[e.uid].source_problem
    for uid, verdict in verdicts.items():
        if verdict.node is None:
            assert uid not in sent and uid not in first.verdicts
        elif uid not in sent:  # left out: its verdict says why
            changed = first.verdicts[uid]
            assert changed.problem_field and (changed.node, changed.gpu) == (verdict.node, "g0")
    # the model generations recorded: planned again, the very same sets
    assert plan(first.model_generations).by_node == first.by_node
