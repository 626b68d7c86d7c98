"""Source credentials read only where a namespace opted in (issue 27, item 9): the operator's
settings, the loop over in-memory stand-ins (a namespace that did not opt in is never
asked for a Secret; a 403 is the model's condition, not a failed turn), and the status
such a model gets."""

from __future__ import annotations

import argparse
import asyncio
import base64
from collections.abc import Callable
from typing import Any

import pytest

from modelswap_api import kube
from modelswap_api.models import HostedModel
from modelswap_operator.cache import Cache
from modelswap_operator.command import register, settings_from
from modelswap_operator.desired import credentials_refusal
from modelswap_operator.errors import SettingsError
from modelswap_operator.settings import OperatorSettings
from modelswap_operator.status import Observed, Verdict, build_status
from modelswap_operator.status_events import events_between
from tests.support.waiting import until_on_loop
from tests.unit.test_operator_day2_parts import NOW, POLICY, UID, condition
from tests.unit.test_operator_loop import FakeAgents, FakeKube, deployment, reconciler_over

SOURCE_AUTHORIZATION = "Bearer hub-token"


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["operator", *argv])


# -- settings ----------------------------------------------------------------------------------


def test_opt_in_settings_from_flags_and_environment() -> None:
    assert settings_from(args(), {}).credential_namespaces is None  # cluster: every namespace
    opted = settings_from(
        args("--credentials-opt-in", "--credentials-namespace", "team-a",
             "--credentials-namespace", "team-c"), {}
    )  # fmt: skip
    assert opted.credential_namespaces == ("team-a", "team-c")
    # Opted in with no namespace listed: no Secret may be read anywhere.
    assert settings_from(args("--credentials-opt-in"), {}).credential_namespaces == ()
    env = {"MODELSWAP_CREDENTIALS_OPT_IN": "true", "MODELSWAP_CREDENTIALS_NAMESPACES": "a, b"}
    assert settings_from(args(), env).credential_namespaces == ("a", "b")
    with pytest.raises(SettingsError, match="only with --credentials-opt-in"):
        settings_from(args("--credentials-namespace", "team-a"), {})
    with pytest.raises(SettingsError, match="team-b: not served"):
        settings_from(args("--namespace", "team-a", "--credentials-opt-in",
                           "--credentials-namespace", "team-b"), {})  # fmt: skip


def test_the_refusal_names_the_namespace_and_how_to_opt_in() -> None:
    assert credentials_refusal("team-b", None) is None
    assert credentials_refusal("team-a", ("team-a",)) is None
    message = credentials_refusal("team-b", ("team-a", "team-c")) or ""
    assert "namespace 'team-b' has not opted in" in message
    assert "operator.credentials.namespaces (now: team-a, team-c)" in message
    assert "add 'team-b' there and run helm upgrade" in message
    assert "(now: none)" in (credentials_refusal("team-b", ()) or "")


# -- status --------------------------------------------------------------------------------------


def test_a_model_not_yet_held_is_not_loaded_with_the_opt_in_reason() -> None:
    message = credentials_refusal("team-b", ("team-a",)) or ""
    verdict = Verdict(node="n1", gpu="g0", policy=POLICY, reason="CredentialsNotOptedIn",
                      message=message,
                      problem_field="spec.model.source.credentialsSecretRef")  # fmt: skip
    status = build_status(generation=1, deleting=False, verdict=verdict,
                          observed=Observed(node_live=True), previous=None, now=NOW)  # fmt: skip
    loaded, ready = condition(status, "Loaded"), condition(status, "Ready")
    assert (loaded["status"], loaded["reason"]) == ("False", "CredentialsNotOptedIn")
    assert loaded["message"].startswith("spec.model.source.credentialsSecretRef: namespace")
    assert (ready["status"], ready["reason"]) == ("False", "NotLoaded")
    assert "'team-b' has not opted in" in ready["message"]
    notes = events_between(None, status)
    assert ("Warning", "CredentialsNotOptedIn") in {(n.type, n.reason) for n in notes}


def test_a_held_model_whose_namespace_left_the_list_keeps_serving_and_warns() -> None:
    """Switching an install to optIn leaves a loaded model serving (sent without
    credentials, as when its Secret is deleted); the reason says why its source is out of
    reach."""
    observed = Observed(node_live=True, hosted=HostedModel(uid=UID, state="Resident"),
                        routed=True, endpoint="c.team-b.svc")  # fmt: skip
    before = build_status(
        generation=1, deleting=False, observed=observed, previous=None, now=NOW,
        verdict=Verdict(node="n1", gpu="g0", policy=POLICY, reason="Placed"),
    )  # fmt: skip
    verdict = Verdict(node="n1", gpu="g0", policy=POLICY, reason="Placed",
                      source_problem="spec.model.source.credentialsSecretRef: "
                                     + (credentials_refusal("team-b", ()) or ""),
                      source_reason="CredentialsNotOptedIn")  # fmt: skip
    after = build_status(generation=1, deleting=False, verdict=verdict, observed=observed,
                         previous=before, now=NOW)  # fmt: skip
    loaded, ready = condition(after, "Loaded"), condition(after, "Ready")
    assert (loaded["status"], loaded["reason"]) == ("True", "CredentialsNotOptedIn")
    assert (ready["status"], ready["reason"]) == ("True", "Serving")
    (note,) = events_between(before, after)
    assert (note.type, note.reason) == ("Warning", "CredentialsNotOptedIn")


# -- the loop ------------------------------------------------------------------------------------


class SecretsKube(FakeKube):
    """FakeKube whose user Secrets live in `secrets` by (namespace, name), a namespace in
    `forbidden` answering 403 as RBAC does; every user Secret read is recorded."""

    def __init__(self, forbidden: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.swapnodes, self.leases = self.swapnodes[:1], self.leases[:1]
        encoded = base64.b64encode(SOURCE_AUTHORIZATION.encode()).decode()
        self.secrets = {(ns, "hub"): {"data": {"authorization": encoded}}
                        for ns in ("team-a", "team-b", "team-c")}  # fmt: skip
        self.forbidden = forbidden
        self.secret_reads: list[tuple[str, str]] = []

    async def call(self, helper: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if helper.__name__ == "read_secret" and args[0] != "ops":  # not the control token
            namespace, name = args
            self.secret_reads.append((namespace, name))
            if namespace in self.forbidden:
                raise kube.KubeError(f"get secret {namespace}/{name}: Forbidden", status=403)
            return self.secrets.get((namespace, name))
        return await super().call(helper, *args, **kwargs)


def fetched(index: int, namespace: str) -> dict[str, Any]:
    body = deployment(index)
    body["metadata"]["namespace"] = namespace
    body["spec"]["model"]["source"] = {"uri": "https://models.example/m.tar.gz",
                                       "credentialsSecretRef": {"name": "hub"}}  # fmt: skip
    return body


async def run_until(
    kube_: SecretsKube, agents: FakeAgents, settings: OperatorSettings, *,
    bodies: list[dict[str, Any]], what: str, done: Callable[[], bool],
) -> None:  # fmt: skip
    cache = Cache()
    reconciler = reconciler_over(kube_, agents, cache)
    reconciler.settings = settings
    loop = asyncio.create_task(reconciler.run())
    try:
        for body in bodies:
            cache.put_deployment(body)
        await until_on_loop(done, what)
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop


def loaded_of(kube_: SecretsKube, name: str) -> dict[str, Any]:
    for found in (kube_.statuses.get(name) or {}).get("conditions") or ():
        if found["type"] == "Loaded":
            return dict(found)
    return {}


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_only_opted_in_namespaces_are_asked_for_secrets() -> None:
    kube_ = SecretsKube()
    settings = OperatorSettings(batch_seconds=0.2, tick_seconds=1.0, grace_seconds=90,
                                credential_namespaces=("team-a",))  # fmt: skip
    bodies = [fetched(0, "team-a"), fetched(1, "team-b"), fetched(2, "team-b")]
    agents = FakeAgents()
    await run_until(
        kube_,
        agents,
        settings,
        bodies=bodies,
        what="team-b's models told to opt in, team-a's pushed",
        done=lambda: (
            loaded_of(kube_, "m1").get("reason") == "CredentialsNotOptedIn"
            and loaded_of(kube_, "m2").get("reason") == "CredentialsNotOptedIn"
            and any(a.sets and a.sets[-1].entries for a in agents.agents.values())
        ),
    )
    assert set(kube_.secret_reads) == {("team-a", "hub")}  # team-b was never asked
    (agent,) = agents.agents.values()
    (entry,) = agent.sets[-1].entries  # team-b's are left out: their load would fail
    assert entry.namespace == "team-a" and entry.credentials is not None
    assert entry.credentials.bearer_token == "hub-token"
    message = loaded_of(kube_, "m1")["message"]
    assert "namespace 'team-b' has not opted in" in message
    assert "operator.credentials.namespaces (now: team-a)" in message


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_403_on_a_secret_is_that_models_condition_and_the_others_go_on() -> None:
    """RBAC and the settings disagree (the operator run by hand without the chart's opt-in
    flags): the 403 is the model's CredentialsNotOptedIn, every other model is served."""
    kube_ = SecretsKube(forbidden=frozenset({"team-c"}))
    settings = OperatorSettings(batch_seconds=0.2, tick_seconds=1.0, grace_seconds=90)
    bodies = [fetched(0, "team-a"), fetched(1, "team-c"), deployment(2)]
    await run_until(
        kube_,
        FakeAgents(),
        settings,
        bodies=bodies,
        what="team-c's model told why, the others placed",
        done=lambda: (
            loaded_of(kube_, "m1").get("reason") == "CredentialsNotOptedIn"
            and all(kube_.statuses.get(n, {}).get("node") for n in ("m0", "m2"))
        ),
    )
    message = loaded_of(kube_, "m1")["message"]
    assert "refused the operator reading Secret 'hub' in namespace 'team-c' (403)" in message
    assert "operator.credentials.namespaces" in message
    assert loaded_of(kube_, "m0")["reason"] != "CredentialsNotOptedIn"
