"""The operator's pure day-2 parts (issue 27): the term a leader starts at after its Lease
was deleted, Event series (a repeated transition bumps its Event, an expired Event starts
a new one), the status of a model whose credentials Secret is gone, and a new leader
renewing its Lease from the moment it holds it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from modelswap_api import kube
from modelswap_api.control import MAX_REVISION_NUMBER, Revision
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import HostedModel
from modelswap_api.policy import effective_policy
from modelswap_operator.errors import TermExhausted
from modelswap_operator.events import EventRecorder
from modelswap_operator.leadership import LeadershipLost
from modelswap_operator.runtime import Runtime
from modelswap_operator.settings import OperatorSettings
from modelswap_operator.status import Observed, Verdict, build_status
from modelswap_operator.status_events import events_between
from modelswap_operator.terms import term_above

UID = "2f1c8a52-7d0e-4c1b-9a57-0d1b5c3e9a10"
NOW = "2026-11-27T15:00:00Z"
POLICY = effective_policy(
    {"model": {"source": {"uri": "https://models.example/m.tar.gz"}, "weightsBytes": "32Mi"}},
    BUILTIN_DEFAULTS,
)
INVOLVED = {
    "apiVersion": "modelswap.io/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": {"name": "classify", "namespace": "team-a", "uid": UID},
}


# -- the term to start at ----------------------------------------------------------------------


def test_a_recreated_lease_starts_above_every_term_the_agents_have_seen() -> None:
    # The Lease was deleted and re-created at 0; the agents saw term 5 (one of them never
    # heard from a leader).
    seen = [Revision(term=5, counter=242), Revision(term=4, counter=9), None]
    assert term_above(0, seen) == 6
    # The same term with a higher counter (a leader that ran under term 0 before the Lease
    # went) is outranked too.
    assert term_above(0, [Revision(term=0, counter=242)]) == 1


def test_an_ordinary_take_over_keeps_the_leases_term() -> None:
    # leaseTransitions went 5 -> 6: the agents saw at most 5.
    assert term_above(6, [Revision(term=5, counter=1_000), Revision(term=5, counter=3)]) == 6
    assert term_above(6, []) == 6 and term_above(6, [None]) == 6


def test_no_term_above_the_control_apis_bound() -> None:
    assert term_above(0, [Revision(term=MAX_REVISION_NUMBER - 1, counter=1)]) == (
        MAX_REVISION_NUMBER
    )
    with pytest.raises(TermExhausted, match=str(MAX_REVISION_NUMBER)):
        term_above(0, [Revision(term=MAX_REVISION_NUMBER, counter=1)])


# -- Event series --------------------------------------------------------------------------------


class FakeEvents:
    """`KubeIO.call` for create_event and patch_event over a dict of Events by name;
    `expire()` drops them all as the API server's event TTL would, `fail` makes every
    call answer 500."""

    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.fail = False

    async def call(self, helper: Callable[..., Any], namespace: str, *args: Any) -> Any:
        if self.fail:
            raise kube.KubeError("boom", status=500)
        if helper is kube.create_event:
            (body,) = args
            self.events[body["metadata"]["name"]] = dict(body)
            return body
        if helper is kube.patch_event:
            name, patch = args
            if name not in self.events:
                raise kube.NotFound(f"event {name} not found", status=404)
            self.events[name].update(patch)
            return self.events[name]
        raise AssertionError(helper)

    def expire(self) -> None:
        self.events.clear()


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 27, 15, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=30)
        return self.now


@pytest.mark.asyncio
async def test_a_repeated_transition_bumps_its_event_and_a_new_one_is_posted() -> None:
    io = FakeEvents()
    recorder = EventRecorder(io, clock=Clock())  # type: ignore[arg-type]
    ready = ("Normal", "Serving", "Ready=True: answering at classify.team-a.svc")
    lost = ("Warning", "NodeLost", "Ready=False: the node's Lease is stale")
    for note in (ready, lost, ready, lost, ready):
        await recorder.post(INVOLVED, *note)
    by_reason = {e["reason"]: e for e in io.events.values()}
    assert len(io.events) == 2, io.events
    assert by_reason["Serving"]["count"] == 3 and by_reason["NodeLost"]["count"] == 2
    # The newest occurrence is the last Serving one: what the condition says now.
    assert by_reason["Serving"]["lastTimestamp"] > by_reason["NodeLost"]["lastTimestamp"]
    assert by_reason["Serving"]["firstTimestamp"] < by_reason["NodeLost"]["firstTimestamp"]
    assert by_reason["Serving"]["involvedObject"]["uid"] == UID


@pytest.mark.asyncio
async def test_an_expired_event_starts_a_new_series_and_a_failed_post_is_not_counted() -> None:
    io = FakeEvents()
    recorder = EventRecorder(io, clock=Clock())  # type: ignore[arg-type]
    note = ("Warning", "NodeLost", "Ready=False: the node's Lease is stale")
    await recorder.post(INVOLVED, *note)
    io.expire()
    await recorder.post(INVOLVED, *note)
    (event,) = io.events.values()
    assert event["count"] == 1
    io.fail = True
    await recorder.post(INVOLVED, *note)  # logged, not raised
    io.fail = False
    await recorder.post(INVOLVED, *note)
    (event,) = io.events.values()
    assert event["count"] == 2


# -- credentials gone ----------------------------------------------------------------------------


def status_with(hosted: HostedModel | None, previous: dict[str, Any] | None) -> dict[str, Any]:
    verdict = Verdict(node="n1", gpu="g0", policy=POLICY, reason="Placed",
                      source_problem="spec.model.source.credentialsSecretRef: "
                                     "Secret 'hub' does not exist")  # fmt: skip
    return build_status(
        generation=1, deleting=False, verdict=verdict,
        observed=Observed(node_live=True, hosted=hosted, routed=True, endpoint="c.team-a.svc"),
        previous=previous, now=NOW,
    )  # fmt: skip


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in status["conditions"] if c["type"] == kind)
    return found


def test_a_held_model_without_credentials_serves_and_says_its_source_is_unreachable() -> None:
    before = build_status(
        generation=1, deleting=False,
        verdict=Verdict(node="n1", gpu="g0", policy=POLICY, reason="Placed"),
        observed=Observed(node_live=True, hosted=HostedModel(uid=UID, state="Resident"),
                          routed=True, endpoint="c.team-a.svc"),
        previous=None, now=NOW,
    )  # fmt: skip
    after = status_with(HostedModel(uid=UID, state="Resident"), before)
    loaded, ready = condition(after, "Loaded"), condition(after, "Ready")
    assert (loaded["status"], loaded["reason"]) == ("True", "CredentialsUnavailable")
    assert "no longer reachable" in loaded["message"] and "'hub'" in loaded["message"]
    assert (ready["status"], ready["reason"]) == ("True", "Serving")
    (note,) = events_between(before, after)
    assert (note.type, note.reason) == ("Warning", "CredentialsUnavailable")


def test_a_failed_reload_without_credentials_gives_that_reason() -> None:
    failed = HostedModel(uid=UID, state="Failed", reason="BadSource",
                         message="spec.model.source: 401 Unauthorized")  # fmt: skip
    status = status_with(failed, None)
    loaded, ready = condition(status, "Loaded"), condition(status, "Ready")
    assert (loaded["status"], loaded["reason"]) == ("False", "CredentialsUnavailable")
    assert "Secret 'hub' does not exist" in loaded["message"]
    assert ready["status"] == "False"


# -- starting to lead ----------------------------------------------------------------------------


class SlowStart:
    """An elector that leads at once, and a token read that takes its time (or fails)."""

    def __init__(self, *, lose: bool) -> None:
        self.lose = lose
        self.term = 0
        self.renewing = asyncio.Event()

    async def acquire(self) -> int:
        return 0

    async def hold(self) -> None:
        self.renewing.set()
        if self.lose:
            raise LeadershipLost("another holder")
        await asyncio.Event().wait()

    async def release(self) -> bool:
        return True


def runtime_over(elector: SlowStart, on_lost: Callable[[], None] | None = None) -> Runtime:
    runtime = Runtime(OperatorSettings(http_port=0), api=object(), on_lost=on_lost)
    runtime.elector = elector  # type: ignore[assignment]
    return runtime


@pytest.mark.asyncio
async def test_renewals_start_before_the_rest_of_the_start() -> None:
    elector = SlowStart(lose=False)
    runtime = runtime_over(elector)

    async def slow_token() -> str:
        await asyncio.wait_for(elector.renewing.wait(), 5)  # renewing while the token is read
        raise kube.KubeError("the token Secret cannot be read", status=500)

    runtime.tokens.ensure = slow_token  # type: ignore[method-assign]
    with pytest.raises(kube.KubeError):
        await runtime.start()
    assert runtime._holder is not None
    await asyncio.sleep(0)
    assert runtime._holder.cancelled()  # a failed start leaves no renewals behind
    await runtime.stop()


@pytest.mark.asyncio
async def test_leadership_lost_while_starting_runs_no_loop() -> None:
    elector = SlowStart(lose=True)
    lost = asyncio.Event()
    runtime = runtime_over(elector, on_lost=lost.set)

    async def slow_token() -> str:
        await asyncio.wait_for(lost.wait(), 5)
        return "t"

    runtime.tokens.ensure = slow_token  # type: ignore[method-assign]
    await runtime.start()
    assert runtime.lost and runtime._loop is None and not runtime.ready()
    await runtime.stop()
