"""The recommended install's credentials rights (issue 27, item 9), under real RBAC: `helm
install` with `operator.credentials.access: optIn` and one namespace listed, into the
authorizing API emulator; the operator pod run from the rendered args with the chart's
ServiceAccount (chart_world), one real agent with real Triton (operator_world's harness).

Two namespaces hold the same credentials Secret and the same model fetched over http with
it. The opted-in one loads with its credentials and answers through its Service; the other
is told, in its Loaded condition and a Warning Event, that its namespace did not opt in and
how to opt in. The request log shows the operator never asked for a Secret outside the
opted-in namespace, every Secret right the chart gave it was used, nothing was refused and
nothing it did is unexplained by a chart rule.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_chart_install import (
    SOURCE_AUTHORIZATION,
    SOURCE_SECRET,
    Cluster,
    _Sources,
    brief,
    kopf_retry,
    source_model,
    unexplained,
    unused,
)
from tests.support.agent_harness import TOKEN
from tests.support.chart_world import (
    NAMESPACE,
    OPERATOR,
    Ports,
    chart_values,
    grants,
    install,
    operator,
    service_account_user,
)
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.operator_world import GRACE_SECONDS, agents
from tests.support.origin import mlp_archive, served
from tests.support.service_calls import mlp_answers, slice_address
from tests.support.waiting import until

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]
OPTED_IN, NOT_OPTED_IN = "team-a", "team-b"
NODE = "node-a"


@pytest.fixture
def source_url() -> Iterator[str]:
    """The install test's http source: the archive only for SOURCE_AUTHORIZATION."""
    _Sources.archive = mlp_archive()
    _Sources.authorizations = []
    with served(_Sources) as url:
        yield url


def values(ports: Ports) -> dict[str, Any]:
    """chart_values with the recommended credentials setting, and the grace period of
    operator_world's agents (the operator's pushes must keep them unfenced)."""
    found = chart_values(ports, grace_seconds=int(GRACE_SECONDS))
    found["operator"]["credentials"] = {"access": "optIn", "namespaces": [OPTED_IN]}
    return found


def seed(api: EmulatorThread) -> None:
    """What the cluster holds before the chart: the namespaces, the Node the agent runs on,
    the control token the harness's agents were given, and in both user namespaces the
    same credentials Secret."""
    encoded = base64.b64encode(SOURCE_AUTHORIZATION.encode()).decode()
    for name in (NAMESPACE, OPTED_IN, NOT_OPTED_IN):
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    api.create({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": NODE, "labels": {"pool": "sim", "kubernetes.io/hostname": NODE}}})  # fmt: skip
    api.create({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "modelswap-control-token", "namespace": NAMESPACE},
                "data": {"token": base64.b64encode(TOKEN.encode()).decode()}})  # fmt: skip
    for namespace in (OPTED_IN, NOT_OPTED_IN):
        api.create({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": SOURCE_SECRET, "namespace": namespace},
                    "data": {"authorization": encoded}})  # fmt: skip


def model_in(namespace: str, url: str) -> dict[str, Any]:
    body = source_model(url)
    body["metadata"]["namespace"] = namespace
    return body


def condition(cluster: Cluster, namespace: str, kind: str) -> dict[str, Any]:
    found = cluster.model("fetched", namespace) or {}
    for item in (found.get("status") or {}).get("conditions") or ():
        if item["type"] == kind:
            return dict(item)
    return {}


def told(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    """The model's Loaded condition once it says its namespace did not opt in."""
    loaded = condition(cluster, namespace, "Loaded")
    return loaded if loaded.get("reason") == "CredentialsNotOptedIn" else None


@pytest.mark.timeout(300)
async def test_opt_in_reads_credentials_only_where_a_namespace_opted_in(
    tmp_path: Path, source_url: str
) -> None:
    ports = Ports.pick()
    with EmulatorThread(tls=True) as api:
        seed(api)
        release = install(api, values(ports), tmp_path)
        cluster = Cluster(api)
        async with agents(api, tmp_path, names=(NODE,)):
            with operator(api, release, tmp_path / "operator"):
                for namespace in (OPTED_IN, NOT_OPTED_IN):
                    cluster.custom.create_namespaced_custom_object(
                        "modelswap.io", "v1alpha1", namespace, "modeldeployments",
                        model_in(namespace, source_url),
                    )  # fmt: skip

                # The opted-in namespace: loaded with its credentials, answering.
                await until(
                    lambda: condition(cluster, OPTED_IN, "Ready").get("status") == "True",
                    f"{OPTED_IN}/fetched Ready", 120,
                )  # fmt: skip
                assert set(_Sources.authorizations) == {SOURCE_AUTHORIZATION}
                endpoint_slice = cluster.discovery.read_namespaced_endpoint_slice(
                    "fetched-modelswap", OPTED_IN
                )
                address, port = slice_address(endpoint_slice)
                await mlp_answers(address, port, f"fetched.{OPTED_IN}.svc", "fetched")

                # The other: told why and how to opt in; never loaded.
                loaded = await until(
                    lambda: told(cluster, NOT_OPTED_IN),
                    f"{NOT_OPTED_IN}/fetched told its namespace did not opt in",
                )
                assert loaded["status"] == "False"
                message = loaded["message"]
                assert f"namespace '{NOT_OPTED_IN}' has not opted in" in message, message
                assert f"operator.credentials.namespaces (now: {OPTED_IN})" in message, message
                assert f"add '{NOT_OPTED_IN}' there and run helm upgrade" in message, message
                assert condition(cluster, NOT_OPTED_IN, "Ready")["status"] == "False"
                warnings = await until(
                    lambda: [e for e in cluster.core.list_namespaced_event(NOT_OPTED_IN).items
                             if e.reason == "CredentialsNotOptedIn" and e.type == "Warning"],
                    "a Warning Event saying so",
                )  # fmt: skip
                assert NOT_OPTED_IN in (warnings[0].message or "")
                # Every fetch carried the credentials: the other model was never sent.
                assert set(_Sources.authorizations) == {SOURCE_AUTHORIZATION}
        records = api.request_log()
        cluster.client.close()

    operator_user = service_account_user(NAMESPACE, OPERATOR)
    mine = [r for r in records if r.user == operator_user]
    secret_reads = {(r.verb, r.namespace, r.name, r.code) for r in mine if r.resource == "secrets"}
    # No Secret request of any kind outside the opted-in namespace (and the operator's own
    # for its control token).
    assert {ns for _, ns, _, _ in secret_reads} == {OPTED_IN, NAMESPACE}, secret_reads
    assert ("get", OPTED_IN, SOURCE_SECRET, 200) in secret_reads, secret_reads
    refused = [r for r in mine if (not r.allowed or r.code in (401, 403) or r.code >= 500)
               and not kopf_retry(r, operator_user)]  # fmt: skip
    assert refused == [], brief(refused)
    operator_grants = [g for g in grants(release) if g.user == operator_user]
    secret_grants = [g for g in operator_grants if g.resource == "secrets"]
    assert {(g.namespace, g.verb, g.names) for g in secret_grants} == {
        (OPTED_IN, "get", ()),
        (NAMESPACE, "create", ()),
        (NAMESPACE, "get", ("modelswap-control-token",)),
    }
    # Every Secret right was used (the token's create: the Secret existed, so not here).
    assert unused([g for g in secret_grants if g.verb == "get"], records) == []
    assert unexplained(operator_grants, records, {operator_user}) == [], brief(
        unexplained(operator_grants, records, {operator_user})
    )
