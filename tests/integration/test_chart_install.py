"""The chart as a cluster would run it: `helm install` into the authorizing API emulator
(HTTPS, ServiceAccount tokens, RBAC, ValidatingAdmissionPolicies), then the real operator
and the real agent (sim GPUs, real Triton) started from the rendered commands, env and
settings files with the chart's ServiceAccounts -- exactly the rights the chart grants.

The node pod's PID 1 is the real supervisor (`modelswap node`) with the rendered args, env
and node.yaml; it runs the agent and Triton under the image's uids for them
(tests/support/chart_node.py says what stands in for the kubelet and the image). As root,
the test checks the agent, Triton and every model stub run under those uids; unprivileged
the supervisor cannot switch, and that part is skipped with a warning (`UidsNotExercised`).

A user applies models, gets answers through their Services, deletes one; the request log
then shows every rule the chart grants was used and nothing the components needed was
refused; and the node's token cannot write another node's objects or read user Secrets.
Not exercised: a container runtime (capabilities, seccomp, read-only root filesystem,
memory limits), the pod network, real GPUs."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from kubernetes import client

from modelswap_api.tls import pinned_context
from tests.support.agent_harness import Control
from tests.support.chart_node import NodePod, node_pod
from tests.support.chart_world import (
    NAMESPACE,
    NODE,
    NODE_LEASES,
    NODE_OBJECTS,
    OPERATOR,
    OTHER_NODE,
    POD_IP,
    POOL,
    Grant,
    OperatorPod,
    Ports,
    Release,
    chart_values,
    grants,
    install,
    operator,
    service_account_user,
)
from tests.support.dashboard import dashboard_metrics, named_metrics, scraped_names
from tests.support.kube_emulator.audit import RequestRecord
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import REPO_ROOT, Kubectl, api_client, load_yaml
from tests.support.origin import mlp_archive, served
from tests.support.service_calls import mlp_answers, slice_address
from tests.support.waiting import until

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

EXAMPLES = REPO_ROOT / "examples" / "toy"
GROUP, VERSION = "modelswap.io", "v1alpha1"
SOURCE_SECRET = "mlp-source"
SOURCE_AUTHORIZATION = "Bearer source-token-1"
POLICY_MESSAGE = "a modelswap node may write only the SwapNode and Lease named after its own node"


# -- an http(s) model source that wants credentials ---------------------------------------------


class _Sources(http.server.BaseHTTPRequestHandler):
    archive: ClassVar[bytes] = b""
    #: The Authorization header of every request.
    authorizations: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        self.authorizations.append(self.headers.get("Authorization"))
        if self.path != "/mlp.tar.gz" or self.headers.get("Authorization") != SOURCE_AUTHORIZATION:
            self.send_error(404 if self.path != "/mlp.tar.gz" else 401)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.archive)))
        self.end_headers()
        self.wfile.write(self.archive)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def source_server() -> Iterator[str]:
    _Sources.archive = mlp_archive()
    _Sources.authorizations = []
    with served(_Sources) as url:
        yield url


# -- what a user sees ----------------------------------------------------------------------------


class Cluster:
    """The admin's (the user's) view through the official client."""

    def __init__(self, api: EmulatorThread) -> None:
        self.client = api_client(api.kubeconfig_path)
        self.core = client.CoreV1Api(self.client)
        self.custom = client.CustomObjectsApi(self.client)
        self.discovery = client.DiscoveryV1Api(self.client)
        self.coordination = client.CoordinationV1Api(self.client)

    def model(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "modeldeployments", name
            )
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        return found

    def ready(self, name: str) -> dict[str, Any] | None:
        found = self.model(name)
        conditions = {c["type"]: c["status"] for c in (found or {}).get("status", {}).get(
            "conditions") or ()}  # fmt: skip
        return found if conditions.get("Ready") == "True" else None

    def swapnode(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.custom.get_cluster_custom_object(
                GROUP, VERSION, "swapnodes", name
            )
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        return found

    def secret(self, name: str, namespace: str = NAMESPACE) -> Any:
        try:
            return self.core.read_namespaced_secret(name, namespace)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise


async def wait_ready(cluster: Cluster, name: str) -> dict[str, Any]:
    try:
        found: dict[str, Any] = await until(lambda: cluster.ready(name), f"{name} Ready", 90)
    except AssertionError as e:
        raise AssertionError(f"{e}; status: {(cluster.model(name) or {}).get('status')}") from None
    return found


async def classify_through_service(cluster: Cluster, name: str) -> None:
    """The address and port the EndpointSlice gives, with the Service's Host header: the
    model answers as the reference computes."""
    endpoint_slice = cluster.discovery.read_namespaced_endpoint_slice(
        f"{name}-modelswap", "default"
    )
    cluster.core.read_namespaced_service(name, "default")  # the Service exists
    address, port = slice_address(endpoint_slice)
    await mlp_answers(address, port, f"{name}.default.svc", name)


def published(cluster: Cluster, unlike: str | None = None) -> dict[str, Any] | None:
    """The SwapNode's status once it publishes an endpoint and a certificate (other than
    `unlike`: a restarted agent makes a new key)."""
    status: dict[str, Any] = (cluster.swapnode(NODE) or {}).get("status") or {}
    certificate = status.get("certificate")
    return status if certificate and status.get("endpoint") and certificate != unlike else None


async def pin(control: Control, cluster: Cluster, unlike: str | None = None) -> str:
    """Talk to the node's control API as the operator does: the SwapNode's endpoint and
    certificate (pinned); answers the certificate."""
    status = await until(lambda: published(cluster, unlike), "the SwapNode's certificate")
    await control.switch_to(status["endpoint"], verify=pinned_context(status["certificate"]))
    certificate: str = status["certificate"]
    return certificate


# -- the node's refusals --------------------------------------------------------------------------


def refused(call: Any) -> tuple[int, str]:
    with pytest.raises(client.ApiException) as raised:
        call()
    return raised.value.status, json.loads(raised.value.body)["message"]


def by_policy(message: str) -> bool:
    """The refusal names the chart's admission policy and its message (the policy's
    `reason: Forbidden` makes it a 403, as the API server does; RBAC's 403s name no policy)."""
    policy = f"ValidatingAdmissionPolicy '{NODE_OBJECTS}-own-objects'"
    return policy in message and message.endswith(POLICY_MESSAGE)


def node_refusals(cluster: Cluster, node: NodePod) -> None:
    """With the node's own token: another node's SwapNode (and status) and Lease are refused
    by the admission policy, a Secret in a user namespace by RBAC (403)."""
    other_swapnode = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SwapNode",
                      "metadata": {"name": OTHER_NODE}}  # fmt: skip
    other_lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                   "metadata": {"name": OTHER_NODE, "namespace": NODE_LEASES},
                   "spec": {"holderIdentity": OTHER_NODE, "leaseDurationSeconds": 4}}  # fmt: skip
    with api_client(node.kubeconfig) as kube:
        custom = client.CustomObjectsApi(kube)
        leases = client.CoordinationV1Api(kube)
        core = client.CoreV1Api(kube)
        for call in (
            lambda: custom.create_cluster_custom_object(
                GROUP, VERSION, "swapnodes", other_swapnode
            ),
            lambda: leases.create_namespaced_lease(NODE_LEASES, other_lease),
        ):
            code, message = refused(call)
            assert (code, by_policy(message)) == (403, True), (code, message)
        # node-b's own agent would have made these; node-a may not touch them.
        cluster.custom.create_cluster_custom_object(GROUP, VERSION, "swapnodes", other_swapnode)
        cluster.coordination.create_namespaced_lease(NODE_LEASES, other_lease)
        patch = {"metadata": {"labels": {"hijacked": "true"}}}
        status = {"status": {"agentVersion": "hijacked"}}
        lease = cluster.coordination.read_namespaced_lease(OTHER_NODE, NODE_LEASES)
        lease.spec.holder_identity = NODE
        for call in (
            lambda: custom.patch_cluster_custom_object(GROUP, VERSION, "swapnodes", OTHER_NODE,
                                                       patch),
            lambda: custom.patch_cluster_custom_object_status(GROUP, VERSION, "swapnodes",
                                                              OTHER_NODE, status),
            lambda: leases.replace_namespaced_lease(OTHER_NODE, NODE_LEASES, lease),
        ):  # fmt: skip
            code, message = refused(call)
            assert (code, by_policy(message)) == (403, True), (code, message)
        code, message = refused(lambda: core.read_namespaced_secret(SOURCE_SECRET, "default"))
        assert (code, by_policy(message)) == (403, False), message  # RBAC's refusal
    assert (cluster.swapnode(OTHER_NODE) or {}).get("status") is None
    labels = (cluster.swapnode(OTHER_NODE) or {})["metadata"].get("labels") or {}
    assert "hijacked" not in labels, labels


#: The deliberate refusals above, as the request log shows them.
DELIBERATE = {
    ("create", "swapnodes", "", True),
    ("create", "leases", NODE_LEASES, True),
    ("patch", "swapnodes", "", True),
    ("patch", "swapnodes/status", "", True),
    ("update", "leases", NODE_LEASES, True),
    ("get", "secrets", "default", False),  # RBAC, not admission
}


def kopf_retry(record: RequestRecord, operator_user: str) -> bool:
    """kopf changes a ModelDeployment's finalizers with a JSON patch whose first op tests the
    resourceVersion it last saw; when the operator's own status write got there first, the
    server answers 422 and kopf applies the patch again on its next cycle (kopf's
    `patching.patch_obj`). That refusal is kopf's optimistic concurrency, not a right the
    operator lacks."""
    return (
        record.user == operator_user
        and record.allowed
        and record.code == 422
        and (record.verb, record.resource_with_subresource) == ("patch", "modeldeployments")
    )


def brief(records: list[RequestRecord]) -> list[str]:
    return [f"{r.user} {r.verb} {r.resource_with_subresource} {r.namespace}/{r.name} -> {r.code}"
            for r in records]  # fmt: skip


def unused(all_grants: list[Grant], records: list[RequestRecord]) -> list[str]:
    # A get answered 404 used its right; a write the admission policy refused did not.
    allowed = [r for r in records if r.allowed and r.code not in (401, 403, 422)]
    return [str(g) for g in all_grants if not any(g.allows(r) for r in allowed)]


def unexplained(
    all_grants: list[Grant], records: list[RequestRecord], users: set[str]
) -> list[RequestRecord]:
    """Allowed resource requests of the components that no chart rule grants (a right the
    emulator gives everyone, or a rule the chart is missing)."""
    return [r for r in records if r.user in users and r.allowed and r.resource
            and not any(g.allows(r) for g in all_grants)]  # fmt: skip


# -- the test -------------------------------------------------------------------------------------


async def repairs(
    cluster: Cluster, node: NodePod, control: Control, operator_pod: OperatorPod
) -> None:
    """What restarted components put right, so the rules only repairs use are exercised
    too: a SwapNode without its ownerReference (as one from an agent that predates them, or
    a restore from backup, is) gets it back from a restarted agent (patch swapnodes); a
    Service and an EndpointSlice someone edited are rewritten by a restarted operator
    (patch services, update endpointslices)."""
    gateway = node.settings["gateway"]["port"]
    cluster.custom.patch_cluster_custom_object(
        GROUP, VERSION, "swapnodes", NODE, {"metadata": {"ownerReferences": None}}
    )
    cluster.core.patch_namespaced_service(
        "classify", "default", {"spec": {"ports": [{"name": "http", "port": 80,
                                                     "targetPort": 1, "protocol": "TCP"}]}}
    )  # fmt: skip
    edited = cluster.discovery.read_namespaced_endpoint_slice("classify-modelswap", "default")
    edited.ports[0].port = 1
    cluster.discovery.replace_namespaced_endpoint_slice("classify-modelswap", "default", edited)
    operator_pod.stop()
    certificate = await pin(control, cluster)
    await node.restart_agent()  # a crash the supervisor repairs: Triton keeps serving
    await pin(control, cluster, unlike=certificate)
    owner = await until(
        lambda: (cluster.swapnode(NODE) or {})["metadata"].get("ownerReferences"),
        "the restarted agent to restore the SwapNode's owner",
    )
    node_uid = cluster.core.read_node(NODE).metadata.uid
    assert [(o["kind"], o["name"], o["uid"]) for o in owner] == [("Node", NODE, node_uid)]
    operator_pod.start()
    await until(
        lambda: (
            cluster.core.read_namespaced_service("classify", "default").spec.ports[0].target_port
            == gateway
            and cluster.discovery.read_namespaced_endpoint_slice("classify-modelswap", "default")
            .ports[0]
            .port
            == gateway
        ),
        "the restarted operator to repair classify's Service and EndpointSlice",
    )
    await wait_ready(cluster, "classify")
    await classify_through_service(cluster, "classify")


def _phase(cluster: Cluster, name: str) -> str:
    return str(((cluster.model(name) or {}).get("status") or {}).get("phase"))


async def swap_cycles(cluster: Cluster, control: Control, name: str) -> None:
    """Dropped by hand and called back, twice: the second cycle's condition changes repeat
    the first's, so their Events are bumped (the series' count), not posted again."""
    uid = (cluster.model(name) or {})["metadata"]["uid"]
    for _ in range(2):
        out = await control.swap(uid, "out")
        assert out.json()["outcome"] == "completed", out.text
        await until(lambda: _phase(cluster, name) == "Dropped", f"{name} Dropped in its status")
        await classify_through_service(cluster, name)
        await until(lambda: _phase(cluster, name) == "Resident", f"{name} Resident again")
    counts = [e.count for e in cluster.core.list_namespaced_event("default").items
              if e.involved_object.name == name]  # fmt: skip
    assert max(counts) >= 2, counts


def source_model(url: str) -> dict[str, Any]:
    """The classify example fetched over http with credentials from a Secret."""
    body = load_yaml(EXAMPLES / "classify-drop-on-idle.yaml")
    body["metadata"]["name"] = "fetched"
    body["spec"]["model"]["name"] = "fetched"
    body["spec"]["model"]["source"] = {
        "uri": f"{url}/mlp.tar.gz",
        "sha256": hashlib.sha256(_Sources.archive).hexdigest(),
        "credentialsSecretRef": {"name": SOURCE_SECRET},
    }
    return body


@pytest.mark.timeout(600)
async def test_helm_install_runs_the_scenario_with_exactly_the_rendered_rights(
    tmp_path: Path, source_server: str
) -> None:
    ports = Ports.pick()
    with EmulatorThread(tls=True) as api:
        release: Release = install(api, chart_values(ports), tmp_path)
        cluster = Cluster(api)
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        # What node registration would have made: the Nodes, labelled for the pool.
        for name in (NODE, OTHER_NODE):
            api.create({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": name, "labels": {"modelswap.io/pool": POOL,
                                         "kubernetes.io/hostname": name}}})  # fmt: skip
        # The user's credentials for the http source.
        cluster.core.create_namespaced_secret("default", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": SOURCE_SECRET},
            "data": {"authorization": base64.b64encode(SOURCE_AUTHORIZATION.encode()).decode()},
        })  # fmt: skip
        with operator(api, release, tmp_path / "operator") as operator_pod:
            # The node pods mount the control token Secret, which the operator creates.
            await until(lambda: cluster.secret("modelswap-control-token"),
                        "the operator to create the control token Secret")  # fmt: skip
            async with node_pod(api, release, NODE) as node:
                # The token from the Secret, as the node pod mounts it.
                control = Control(f"https://{POD_IP}:{ports.control}", node.token)
                try:
                    await scenario(cluster, kubectl, node, control, operator_pod, source_server)
                finally:
                    await control.close()
                await dashboard_metrics_are_scraped(ports)
                node_refusals(cluster, node)
                # The other node never renews its Lease: the operator deletes its SwapNode
                # after the release's deadNodeRetentionSeconds (3 s here).
                await until(lambda: cluster.swapnode(OTHER_NODE) is None,
                            "the dead node's SwapNode deleted by the operator", 30)  # fmt: skip
                assert cluster.swapnode(NODE) is not None  # the live one stays
        records = api.request_log()
        cluster.client.close()

    operator_user = service_account_user(NAMESPACE, f"{OPERATOR}")
    node_user = service_account_user(NAMESPACE, NODE_OBJECTS)
    users = {operator_user, node_user}
    mine = [r for r in records if r.user in users]
    assert {r.user for r in mine} == users, "both components ran with the chart's accounts"
    denied = [
        r for r in mine
        if (not r.allowed or r.code in (401, 403, 422) or r.code >= 500)
        and not kopf_retry(r, operator_user)
    ]  # fmt: skip
    # Admission refusals pass RBAC (allowed) and are answered 403; RBAC's are not allowed.
    assert {(r.verb, r.resource_with_subresource, r.namespace, r.allowed) for r in denied} == (
        DELIBERATE
    ), brief(denied)
    assert all(r.code == 403 for r in denied), brief(denied)
    assert all(r.user == node_user for r in denied), brief(denied)
    all_grants = grants(release)
    assert {g.user for g in all_grants} == users
    never_used = unused(all_grants, records)
    assert not never_used, "rules no request used:\n" + "\n".join(never_used)
    assert unexplained(all_grants, records, users) == [], brief(
        unexplained(all_grants, records, users)
    )


class UidsNotExercised(UserWarning):
    """The test ran unprivileged: the supervisor could not switch uids."""


def uids_are_separated(node: NodePod) -> None:
    """The agent, Triton and every model stub (two models loaded) run under the uids and
    groups node.yaml names, as the image defines them, and the agent's differs from
    Triton's."""
    if not node.privileged:
        warnings.warn(UidsNotExercised(
            "not root: the supervisor cannot switch uids, so the agent and Triton ran as "
            "the test's user; uid separation was not exercised"), stacklevel=1)  # fmt: skip
        return
    found = node.identities()
    agent, triton = node.expected_identity("agent"), node.expected_identity("triton")
    assert (found.pop("agent"), found.pop("runtime")) == (agent, triton)
    assert len(found) >= 2, f"no model stubs under Triton: {found}"
    assert all(stub == triton for stub in found.values()), found
    assert agent[0] != triton[0] and 0 not in (agent[0], triton[0])


async def dashboard_metrics_are_scraped(ports: Ports) -> None:
    """Every metric the chart's dashboard queries, and every one docs/operations.md names,
    is in a real scrape of the agent (its node, gateway and engine metrics) or of the
    operator, at the ports the chart renders."""
    scraped: set[str] = set()
    async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
        for port in (ports.metrics, ports.operator_http):
            response = await http.get(f"http://127.0.0.1:{port}/metrics")
            assert response.status_code == 200, response.text
            scraped |= scraped_names(response.text)
    missing = dashboard_metrics() - scraped
    assert not missing, f"the dashboard queries metrics no scrape has: {sorted(missing)}"
    # So do the names docs/operations.md gives (a `*` in one: some metric matches it).
    named = named_metrics((REPO_ROOT / "docs" / "operations.md").read_text())
    unmatched = [p for p in named if not any(re.fullmatch(p, n) for n in scraped)]
    assert named and not unmatched, f"docs/operations.md names metrics no scrape has: {unmatched}"


async def scenario(  # noqa: PLR0917 (the world's parts, in one call)
    cluster: Cluster,
    kubectl: Kubectl,
    node: NodePod,
    control: Control,
    operator_pod: OperatorPod,
    source_url: str,
) -> None:
    """kubectl apply → Ready → an answer through the Service → repairs after restarts →
    kubectl delete → gone, and freed on the node."""
    await pin(control, cluster)
    kubectl.run("apply", "-f", str(EXAMPLES / "classify-drop-on-idle.yaml"), check=True)
    cluster.custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", "modeldeployments", source_model(source_url)
    )
    for name in ("classify", "fetched"):
        found = await wait_ready(cluster, name)
        assert found["status"]["node"] == NODE
        assert found["status"]["endpoint"] == f"{name}.default.svc"
        await classify_through_service(cluster, name)
    assert _Sources.authorizations and set(_Sources.authorizations) == {SOURCE_AUTHORIZATION}
    uids_are_separated(node)
    await swap_cycles(cluster, control, "classify")
    await repairs(cluster, node, control, operator_pod)

    for name in ("classify", "fetched"):
        uid = (cluster.model(name) or {})["metadata"]["uid"]
        assert uid in await control.models()
        kubectl.run("delete", "md", name, "--wait=false", check=True)
        await until(lambda n=name: cluster.model(n) is None, f"{name} gone")  # type: ignore[misc]
        assert uid not in await control.models()
        # The agent's report (written on change) drops it too.
        await until(
            lambda u=uid: u not in json.dumps((cluster.swapnode(NODE) or {}).get("status")),  # type: ignore[misc]
            f"{name} gone from the SwapNode's report",
        )
