"""The authorizing emulator (`EmulatorThread(tls=True)`): HTTPS with its own CA, bearer
tokens (admin, ServiceAccounts, node-bound), RBAC from the stored roles and bindings,
ValidatingAdmissionPolicies in CEL, and the request log -- with the real kubectl, the
official client and kopf as clients, so rights are tested, not assumed."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from kopf.testing import KopfRunner
from kubernetes import client, utils
from kubernetes.client.rest import ApiException

from modelswap_operator.login import connection_info
from tests.support.kube_emulator.audit import RequestRecord
from tests.support.kube_emulator.hosting import EmulatorProcess, EmulatorThread
from tests.support.kube_testing import REPO_ROOT, Kubectl, api_client, load_yaml
from tests.support.waiting import wait_for

NS = "team-a"
GROUP, VERSION = "modelswap.io", "v1alpha1"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
TINY_CHART = REPO_ROOT / "tests" / "data" / "emulator" / "tiny-chart"


@pytest.fixture
def api() -> Iterator[EmulatorThread]:
    with EmulatorThread(tls=True) as api:
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield api


def admin(api: EmulatorThread) -> client.ApiClient:
    return api_client(api.kubeconfig_path)


def apply(api: EmulatorThread, *objects: dict[str, Any]) -> None:
    """Create objects through the API as the admin (as installing a chart would)."""
    with admin(api) as kube:
        for obj in objects:
            utils.create_from_dict(kube, obj)


def service_account(name: str, namespace: str = NS) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace}}  # fmt: skip


def rbac(kind: str, name: str, namespace: str | None = None, **body: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta, **body}


def bind_to(sa: str, namespace: str = NS) -> list[dict[str, str]]:
    return [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]


def role_ref(kind: str, name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


def configmap(name: str, namespace: str = NS) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace}, "data": {"k": name}}  # fmt: skip


def status_of(e: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(e.body)
    return body


def https(
    api: EmulatorThread | EmulatorProcess,
    path: str,
    token: str | None,
    body: dict[str, Any] | None = None,
) -> tuple[int, dict[str, Any]]:
    """A raw GET (or a JSON POST of `body`) trusting only the emulator's CA."""
    assert api.ca_pem is not None
    context = ssl.create_default_context(cadata=api.ca_pem.decode())
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        api.url + path, data=data, headers={"Content-Type": "application/json"}
    )
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def brief(records: list[RequestRecord]) -> list[tuple[str, str, str, str, str, bool, int]]:
    return [(r.user, r.verb, r.resource_with_subresource, r.namespace, r.name, r.allowed, r.code)
            for r in records]  # fmt: skip


# -- HTTPS and authentication -----------------------------------------------------------------


def test_kubectl_speaks_https_to_its_ca_with_the_admin_token(api: EmulatorThread) -> None:
    config = yaml.safe_load(api.kubeconfig_path.read_text())
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"].startswith("https://127.0.0.1:")
    assert base64.b64decode(cluster["certificate-authority-data"]) == api.ca_pem
    kubectl = Kubectl(api.kubeconfig_path, api.home)
    assert "kube-system" in kubectl.run("get", "ns", "-o", "name", check=True).stdout
    whoami = json.loads(kubectl.run("auth", "whoami", "-o", "json", check=True).stdout)
    assert whoami["status"]["userInfo"]["username"] == "kubernetes-admin"
    assert "system:masters" in whoami["status"]["userInfo"]["groups"]
    kubectl.run("apply", "-f", "crds/", check=True)
    assert kubectl.run("auth", "can-i", "patch", "swapnodes.modelswap.io/x", "--subresource",
                       "status", check=True).stdout.strip() == "yes"  # fmt: skip
    users = {r.user for r in api.request_log()}
    assert users == {"kubernetes-admin"}


def test_no_token_or_an_unknown_one_is_401(api: EmulatorThread) -> None:
    api.clear_request_log()
    for token in (None, "not-a-token"):
        code, body = https(api, "/api/v1/namespaces", token)
        assert code == 401
        assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "message": "Unauthorized", "reason": "Unauthorized",
                        "code": 401}  # fmt: skip
    assert https(api, "/healthz", None)[0] == 401  # anonymous requests are off
    assert brief(api.request_log()) == [
        ("", "list", "namespaces", "", "", False, 401),
        ("", "list", "namespaces", "", "", False, 401),
        ("", "get", "", "", "", False, 401),
    ]
    assert https(api, "/api/v1/namespaces", api.token)[0] == 200


def test_a_service_account_token_names_its_user_groups_and_node(api: EmulatorThread) -> None:
    apply(api, service_account("agent"))
    with pytest.raises(LookupError):
        api.token_for(NS, "nobody")
    path = api.write_kubeconfig_for(NS, "agent", node_name="gpu-1")
    kubectl = Kubectl(path, api.home)
    whoami = json.loads(kubectl.run("auth", "whoami", "-o", "json", check=True).stdout)
    user = whoami["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{NS}:agent"
    assert user["groups"] == ["system:serviceaccounts", f"system:serviceaccounts:{NS}",
                              "system:authenticated"]  # fmt: skip
    assert user["extra"][NODE_NAME_EXTRA] == ["gpu-1"]
    # Deleting the ServiceAccount revokes its tokens, as for bound tokens.
    token = api.token_for(NS, "agent")
    assert https(api, "/api", token)[0] == 200
    with admin(api) as kube:
        client.CoreV1Api(kube).delete_namespaced_service_account("agent", NS)
    assert https(api, "/api", token)[0] == 401


def test_token_request_binds_to_a_pod_and_its_node(api: EmulatorThread) -> None:
    apply(api, service_account("agent"))
    api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-2"}})
    pod = api.create({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": "agent-x", "namespace": NS},
                      "spec": {"nodeName": "gpu-2", "containers": [{"name": "a", "image": "i"}]}})  # fmt: skip
    kubectl = Kubectl(api.kubeconfig_path, api.home)
    token = kubectl.run("create", "token", "agent", "-n", NS, "--bound-object-kind", "Pod",
                        "--bound-object-name", "agent-x", check=True).stdout.strip()  # fmt: skip
    assert api.emulator is not None
    path = api.emulator.write_kubeconfig(api.home / "pod-token", NS, token)
    whoami = json.loads(Kubectl(path, api.home).run("auth", "whoami", "-o", "json",
                                                    check=True).stdout)  # fmt: skip
    extra = whoami["status"]["userInfo"]["extra"]
    assert extra[NODE_NAME_EXTRA] == ["gpu-2"]
    assert extra["authentication.kubernetes.io/pod-name"] == ["agent-x"]
    assert extra["authentication.kubernetes.io/pod-uid"] == [pod["metadata"]["uid"]]
    # The token dies with its pod.
    kubectl.run("delete", "pod", "agent-x", "-n", NS, "--wait=false", check=True)
    assert https(api, "/api", token)[0] == 401


# -- RBAC -------------------------------------------------------------------------------------


def test_a_role_for_one_configmap_name_allows_exactly_that(api: EmulatorThread) -> None:
    apply(
        api,
        service_account("reader"),
        configmap("allowed"),
        configmap("other"),
        rbac("Role", "read-one", NS, rules=[
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
             "resourceNames": ["allowed"]}]),
        rbac("RoleBinding", "read-one", NS, roleRef=role_ref("Role", "read-one"),
             subjects=bind_to("reader")),
    )  # fmt: skip
    path = api.write_kubeconfig_for(NS, "reader")
    user = f"system:serviceaccount:{NS}:reader"
    api.clear_request_log()
    with api_client(path) as kube:
        core = client.CoreV1Api(kube)
        assert core.read_namespaced_config_map("allowed", NS).data == {"k": "allowed"}
        with pytest.raises(ApiException) as denied:
            core.read_namespaced_config_map("other", NS)
        assert denied.value.status == 403
        assert status_of(denied.value) == {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f'configmaps "other" is forbidden: User "{user}" cannot get resource '
                       f'"configmaps" in API group "" in the namespace "{NS}"',
            "reason": "Forbidden", "details": {"name": "other", "kind": "configmaps"},
            "code": 403,
        }  # fmt: skip
        with pytest.raises(ApiException) as listed:
            core.list_namespaced_config_map(NS)
        assert status_of(listed.value)["message"] == (
            f'configmaps is forbidden: User "{user}" cannot list resource "configmaps" in API '
            f'group "" in the namespace "{NS}"'
        )
        with pytest.raises(ApiException) as elsewhere:
            core.read_namespaced_config_map("allowed", "default")
        assert elsewhere.value.status == 403
    assert brief(api.request_log()) == [
        (user, "get", "configmaps", NS, "allowed", True, 200),
        (user, "get", "configmaps", NS, "other", False, 403),
        (user, "list", "configmaps", NS, "", False, 403),
        (user, "get", "configmaps", "default", "allowed", False, 403),
    ]
    kubectl = Kubectl(path, api.home)

    def can_i(*args: str) -> str:
        return kubectl.run("auth", "can-i", *args, "-n", NS).stdout.strip()

    assert can_i("get", "configmap/allowed") == "yes"
    assert can_i("get", "configmap/other") == "no"
    assert can_i("list", "configmaps") == "no"
    assert can_i("delete", "configmap/allowed") == "no"
    assert "allowed" in kubectl.run("get", "configmap", "allowed", "-n", NS, check=True).stdout
    refused = kubectl.run("get", "configmap", "other", "-n", NS)
    assert refused.returncode == 1
    assert 'Error from server (Forbidden): configmaps "other" is forbidden' in refused.stderr
    # The admin asks on the ServiceAccount's behalf (impersonation), as chart tests may.
    admin_kubectl = Kubectl(api.kubeconfig_path, api.home)

    def can_it(*args: str) -> str:
        return admin_kubectl.run("auth", "can-i", *args, "-n", NS, f"--as={user}").stdout.strip()

    assert can_it("get", "configmap/allowed") == "yes"
    assert can_it("get", "configmap/other") == "no"
    # ... which the ServiceAccount itself may not do.
    impersonating = kubectl.run("get", "configmap", "allowed", "-n", NS, "--as=jane")
    assert impersonating.returncode == 1
    assert (
        f'users "jane" is forbidden: User "{user}" cannot impersonate resource "users" in API '
        'group "" at the cluster scope'
    ) in impersonating.stderr


def test_a_cluster_role_for_swapnode_status_patch(api: EmulatorThread) -> None:
    with admin(api) as kube:
        ext = client.ApiextensionsV1Api(kube)
        for path in sorted((REPO_ROOT / "crds").glob("*.yaml")):
            ext.create_custom_resource_definition(load_yaml(path))
        client.CustomObjectsApi(kube).create_cluster_custom_object(
            GROUP, VERSION, "swapnodes",
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SwapNode",
             "metadata": {"name": "gpu-1"}, "spec": {"nodeName": "gpu-1"}},
        )  # fmt: skip
    apply(
        api,
        service_account("agent"),
        rbac("ClusterRole", "swapnode-status", rules=[
            {"apiGroups": [GROUP], "resources": ["swapnodes/status"], "verbs": ["patch"]}]),
        rbac("ClusterRoleBinding", "swapnode-status",
             roleRef=role_ref("ClusterRole", "swapnode-status"), subjects=bind_to("agent")),
    )  # fmt: skip
    user = f"system:serviceaccount:{NS}:agent"
    with api_client(api.write_kubeconfig_for(NS, "agent")) as kube:
        custom = client.CustomObjectsApi(kube)
        patched = custom.patch_cluster_custom_object_status(
            GROUP, VERSION, "swapnodes", "gpu-1", {"status": {"agentVersion": "1.0"}}
        )
        assert patched["status"]["agentVersion"] == "1.0"
        with pytest.raises(ApiException) as denied:
            custom.patch_cluster_custom_object(
                GROUP, VERSION, "swapnodes", "gpu-1", {"metadata": {"labels": {"a": "b"}}}
            )
        assert denied.value.status == 403
        assert status_of(denied.value)["message"] == (
            f'swapnodes.{GROUP} "gpu-1" is forbidden: User "{user}" cannot patch resource '
            f'"swapnodes" in API group "{GROUP}" at the cluster scope'
        )
        assert status_of(denied.value)["details"] == {
            "name": "gpu-1",
            "group": GROUP,
            "kind": "swapnodes",
        }
        with pytest.raises(ApiException) as read:
            custom.get_cluster_custom_object(GROUP, VERSION, "swapnodes", "gpu-1")
        assert read.value.status == 403
    # Discovery stays open to every authenticated user (system:discovery), as kubectl needs.
    kubectl = Kubectl(api.write_kubeconfig_for(NS, "agent"), api.home)
    assert "swapnodes" in kubectl.run("api-resources", "--api-group", GROUP, check=True).stdout


def test_subject_access_reviews_follow_the_rbac_matching_rules(api: EmulatorThread) -> None:
    apply(
        api,
        rbac("ClusterRole", "all-status", rules=[
            {"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["update", "patch"]},
            {"nonResourceURLs": ["/metrics", "/debug/*"], "verbs": ["get"]}]),
        rbac("ClusterRoleBinding", "all-status", roleRef=role_ref("ClusterRole", "all-status"),
             subjects=[{"kind": "Group", "name": "ops"}]),
        rbac("RoleBinding", "dangling", NS, roleRef=role_ref("Role", "missing"),
             subjects=[{"kind": "User", "name": "jane"}]),
    )  # fmt: skip

    def allowed(user: str, groups: list[str], **attributes: str) -> tuple[bool, str]:
        key = "nonResourceAttributes" if "path" in attributes else "resourceAttributes"
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": user, "groups": groups, key: attributes}}  # fmt: skip
        with admin(api) as kube:
            answer = client.AuthorizationV1Api(kube).create_subject_access_review(review)
        return answer.status.allowed, answer.status.reason or ""

    ops = ("bob", ["ops", "system:authenticated"])
    assert allowed(*ops, verb="patch", group="apps", resource="deployments",
                   subresource="status", namespace="x") == (True, "")  # fmt: skip
    assert allowed(*ops, verb="patch", group="apps", resource="deployments",
                   namespace="x") == (False, "")  # fmt: skip
    assert allowed(*ops, verb="get", path="/metrics") == (True, "")
    assert allowed(*ops, verb="get", path="/debug/pprof/heap") == (True, "")
    assert allowed(*ops, verb="get", path="/metricsz") == (False, "")
    assert allowed("x", ["system:authenticated"], verb="get", path="/apis/apps/v1") == (True, "")
    assert allowed("jane", [], verb="get", resource="pods", namespace=NS) == (
        False, 'RBAC: role.rbac.authorization.k8s.io "missing" not found'
    )  # fmt: skip


# -- ValidatingAdmissionPolicy ------------------------------------------------------------------


def own_swapnode_policy() -> list[dict[str, Any]]:
    """What the chart ships: an agent may write only the SwapNode named after its node."""
    agent = f"system:serviceaccount:{NS}:agent"
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "agent-own-node"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [GROUP], "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["swapnodes", "swapnodes/status"]}]},
                "matchConditions": [
                    {"name": "is-agent", "expression": f"request.userInfo.username == '{agent}'"}],
                "validations": [{
                    "expression": f"has(request.userInfo.extra) && '{NODE_NAME_EXTRA}' in "
                                  f"request.userInfo.extra && object.metadata.name == "
                                  f"request.userInfo.extra['{NODE_NAME_EXTRA}'][0]",
                    "message": "an agent may write only its own node's SwapNode"}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "agent-own-node-binding"},
            "spec": {"policyName": "agent-own-node", "validationActions": ["Deny"]},
        },
    ]  # fmt: skip


def test_a_policy_lets_a_node_bound_agent_write_only_its_own_swapnode(
    api: EmulatorThread,
) -> None:
    kubectl = Kubectl(api.kubeconfig_path, api.home)
    kubectl.run("apply", "-f", "crds/", check=True)
    documents = [
        service_account("agent"),
        rbac("ClusterRole", "agent", rules=[
            {"apiGroups": [GROUP], "resources": ["swapnodes"], "verbs": ["create", "get"]},
            {"apiGroups": [GROUP], "resources": ["swapnodes/status"],
             "verbs": ["get", "patch"]}]),  # kubectl patch reads first
        rbac("ClusterRoleBinding", "agent", roleRef=role_ref("ClusterRole", "agent"),
             subjects=bind_to("agent")),
        *own_swapnode_policy(),
    ]  # fmt: skip
    kubectl.run("apply", "-f", "-", input_text=yaml.safe_dump_all(documents), check=True)
    for name in ("gpu-1", "gpu-2"):  # the admin is not the agent: the policy does not apply
        kubectl.run("apply", "-f", "-", check=True, input_text=yaml.safe_dump(
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SwapNode", "metadata": {"name": name},
             "spec": {"nodeName": name}}))  # fmt: skip
    denial = (
        "ValidatingAdmissionPolicy 'agent-own-node' with binding 'agent-own-node-binding' "
        "denied request: an agent may write only its own node's SwapNode"
    )
    with api_client(api.write_kubeconfig_for(NS, "agent", node_name="gpu-1")) as kube:
        custom = client.CustomObjectsApi(kube)
        own = custom.patch_cluster_custom_object_status(
            GROUP, VERSION, "swapnodes", "gpu-1", {"status": {"agentVersion": "1.0"}}
        )
        assert own["status"]["agentVersion"] == "1.0"
        with pytest.raises(ApiException) as denied:
            custom.patch_cluster_custom_object_status(
                GROUP, VERSION, "swapnodes", "gpu-2", {"status": {"agentVersion": "1.0"}}
            )
        assert denied.value.status == 422
        assert status_of(denied.value) == {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f'swapnodes.{GROUP} "gpu-2" is forbidden: {denial}',
            "reason": "Invalid",
            "details": {"name": "gpu-2", "kind": "swapnodes", "causes": [{"message": denial}],
                        "group": GROUP},
            "code": 422,
        }  # fmt: skip
        with pytest.raises(ApiException) as created:
            custom.create_cluster_custom_object(
                GROUP, VERSION, "swapnodes",
                {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SwapNode",
                 "metadata": {"name": "gpu-3"}, "spec": {"nodeName": "gpu-3"}},
            )  # fmt: skip
        assert created.value.status == 422
        assert denial in status_of(created.value)["message"]
    # A token of the same ServiceAccount bound to no node writes no SwapNode at all.
    with api_client(api.write_kubeconfig_for(NS, "agent")) as kube:
        with pytest.raises(ApiException) as unbound:
            client.CustomObjectsApi(kube).patch_cluster_custom_object_status(
                GROUP, VERSION, "swapnodes", "gpu-1", {"status": {"agentVersion": "2.0"}}
            )
        assert unbound.value.status == 422
    # kubectl shows the policy's words.
    agent_kubectl = Kubectl(api.write_kubeconfig_for(NS, "agent", node_name="gpu-1"), api.home)
    refused = agent_kubectl.run("patch", "swapnode", "gpu-2", "--subresource=status",
                                "--type=merge", "-p", '{"status":{"agentVersion":"3"}}')  # fmt: skip
    assert refused.returncode == 1
    assert denial in refused.stderr
    stored = kubectl.run("get", "swapnode", "gpu-2", "-o", "json", check=True).stdout
    assert "status" not in json.loads(stored)


def test_policy_reason_message_expression_warn_and_failure_policy(api: EmulatorThread) -> None:
    def policy(name: str, expression: str, **extra: Any) -> dict[str, Any]:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
            "spec": {
                "failurePolicy": extra.pop("failurePolicy", "Fail"),
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"], "operations": ["*"],
                    "resources": ["configmaps"]}],
                    "namespaceSelector": {"matchLabels": {"guarded": "yes"}}},
                "validations": [{"expression": expression, **extra}],
            },
        }  # fmt: skip

    def binding(name: str, *actions: str) -> dict[str, Any]:
        return {"apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
                "spec": {"policyName": name, "validationActions": list(actions)}}  # fmt: skip

    api.create({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "guarded", "labels": {"guarded": "yes"}}})  # fmt: skip
    apply(
        api,
        policy("forbid-x", "object.metadata.name != 'x'", reason="Forbidden",
               messageExpression="'no ' + object.metadata.name + ' by ' + "
                                 "request.userInfo.username"),
        binding("forbid-x", "Deny"),
        policy("warn-y", "object.metadata.name != 'y'"),
        binding("warn-y", "Warn"),
        policy("broken", "object.data.missing == 'z'", failurePolicy="Ignore"),
        binding("broken", "Deny"),
    )  # fmt: skip
    with admin(api) as kube:
        core = client.CoreV1Api(kube)
        with pytest.raises(ApiException) as forbidden:
            core.create_namespaced_config_map("guarded", configmap("x", "guarded"))
        assert forbidden.value.status == 403
        assert status_of(forbidden.value)["reason"] == "Forbidden"
        assert status_of(forbidden.value)["message"] == (
            "configmaps \"x\" is forbidden: ValidatingAdmissionPolicy 'forbid-x' with binding "
            "'forbid-x' denied request: no x by kubernetes-admin"
        )
        core.create_namespaced_config_map(NS, configmap("x"))  # not selected: no label
        _, code, headers = core.create_namespaced_config_map_with_http_info(
            "guarded", configmap("y", "guarded")
        )
        assert code == 201
        assert (
            "Validation failed for ValidatingAdmissionPolicy 'warn-y' with binding "
            "'warn-y': failed expression: object.metadata.name != 'y'" in headers["Warning"]
        )


def test_a_policy_on_delete_sees_the_old_object(api: EmulatorThread) -> None:
    apply(
        api,
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": "keep-lease"},
         "spec": {"matchConstraints": {"resourceRules": [{
                      "apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                      "operations": ["DELETE"], "resources": ["leases"]}]},
                  "validations": [{"expression": "object == null && "
                                                 "oldObject.metadata.name != 'keep'"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "keep-lease"},
         "spec": {"policyName": "keep-lease", "validationActions": ["Deny"]}},
    )  # fmt: skip
    kubectl = Kubectl(api.kubeconfig_path, api.home)
    for name in ("keep", "drop"):
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": name, "namespace": NS}, "spec": {"holderIdentity": name}}  # fmt: skip
        kubectl.run("apply", "-f", "-", input_text=yaml.safe_dump(lease), check=True)
    kubectl.run("delete", "lease", "drop", "-n", NS, check=True)
    refused = kubectl.run("delete", "lease", "keep", "-n", NS)
    assert refused.returncode == 1
    assert (
        "ValidatingAdmissionPolicy 'keep-lease' with binding 'keep-lease' denied request: "
        "failed expression: object == null && oldObject.metadata.name != 'keep'"
    ) in refused.stderr
    assert kubectl.run("get", "lease", "-n", NS, "-o", "name", check=True).stdout.split() == [
        "lease.coordination.k8s.io/keep"
    ]


# -- kopf ---------------------------------------------------------------------------------------


def kopf_connection(kubeconfig: Path) -> kopf.ConnectionInfo:
    """kopf's connection from a kubeconfig: server, CA data and bearer token (what kopf's
    own kubeconfig login reads)."""
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    return kopf.ConnectionInfo(
        server=cluster["server"],
        ca_data=cluster["certificate-authority-data"],
        scheme="Bearer",
        token=config["users"][0]["user"]["token"],
        default_namespace=config["contexts"][0]["context"]["namespace"],
    )


def test_the_operator_login_carries_the_kubeconfig_token(api: EmulatorThread) -> None:
    with api_client(api.kubeconfig_path) as kube:
        info = connection_info(kube)
    assert info.ca_path and Path(info.ca_path).read_bytes() == api.ca_pem
    assert (info.scheme, info.token) == ("Bearer", api.token)


@pytest.fixture
def kopf_kubeconfig(api: EmulatorThread) -> Path:
    """A ServiceAccount with what a kopf operator of ConfigMaps in one namespace needs."""
    apply(
        api,
        service_account("operator"),
        rbac("Role", "operator", NS, rules=[
            {"apiGroups": [""], "resources": ["configmaps"],
             "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]),
        rbac("RoleBinding", "operator", NS, roleRef=role_ref("Role", "operator"),
             subjects=bind_to("operator")),
        # kopf watches CRDs and namespaces cluster-wide even for one namespace (its docs say so;
        # the emulator refused it until granted).
        rbac("ClusterRole", "kopf-scanning", rules=[
            {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
             "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}]),
        rbac("ClusterRoleBinding", "kopf-scanning",
             roleRef=role_ref("ClusterRole", "kopf-scanning"), subjects=bind_to("operator")),
    )  # fmt: skip
    return api.write_kubeconfig_for(NS, "operator")


def test_kopf_connects_over_https_with_a_bearer_token(
    api: EmulatorThread, kopf_kubeconfig: Path
) -> None:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf_connection(kopf_kubeconfig)

    @kopf.on.create("v1", "configmaps", registry=registry)
    def created(patch: kopf.Patch, **_: Any) -> None:
        patch.metadata.setdefault("labels", {})["handled"] = "yes"

    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 30
    settings.networking.request_timeout = 10
    args = ["run", "--standalone", f"--namespace={NS}"]
    with (
        KopfRunner(args, registry=registry, settings=settings, timeout=30) as runner,
        admin(api) as kube,
    ):
        core = client.CoreV1Api(kube)
        core.create_namespaced_config_map(NS, configmap("watched"))

        def handled() -> bool:
            labels = core.read_namespaced_config_map("watched", NS).metadata.labels or {}
            return labels.get("handled") == "yes"

        wait_for(handled, 20, "kopf to handle the ConfigMap")
    assert runner.exception is None
    user = f"system:serviceaccount:{NS}:operator"
    kopf_requests = [r for r in api.request_log() if r.user == user]
    assert kopf_requests, "kopf made no request with the ServiceAccount's token"
    assert all(r.allowed for r in kopf_requests), brief([r for r in kopf_requests if not r.allowed])
    verbs = {(r.verb, r.resource) for r in kopf_requests if r.resource}
    assert {("list", "configmaps"), ("watch", "configmaps"), ("patch", "configmaps")} <= verbs


# -- helm, and the emulator in another process ------------------------------------------------


def test_helm_installs_over_https_and_the_chart_grants_only_what_it_binds(
    api: EmulatorThread,
) -> None:
    env = dict(os.environ, KUBECONFIG=str(api.kubeconfig_path), HOME=str(api.home),
               HELM_CACHE_HOME=str(api.home / "cache"), HELM_CONFIG_HOME=str(api.home / "config"),
               HELM_DATA_HOME=str(api.home / "data"))  # fmt: skip
    Kubectl(api.kubeconfig_path, api.home).run("apply", "-f", "crds/", check=True)
    installed = subprocess.run(
        [str(REPO_ROOT / ".venv" / "bin" / "helm"), "install", "rel", str(TINY_CHART), "-n", NS],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    assert {r.user for r in api.request_log()} == {"kubernetes-admin"}
    # The chart's ClusterRole is bound to nobody: its ServiceAccount may not use it yet.
    with api_client(api.write_kubeconfig_for(NS, "rel-sa")) as kube:
        custom = client.CustomObjectsApi(kube)
        with pytest.raises(ApiException) as denied:
            custom.list_namespaced_custom_object(GROUP, VERSION, NS, "modeldeployments")
        assert denied.value.status == 403
        apply(api, rbac("RoleBinding", "rel", NS, roleRef=role_ref("ClusterRole", "rel-role"),
                        subjects=bind_to("rel-sa")))  # fmt: skip
        assert (
            custom.list_namespaced_custom_object(GROUP, VERSION, NS, "modeldeployments")["items"]
            == []
        )
        with pytest.raises(ApiException) as elsewhere:  # a RoleBinding grants in its namespace
            custom.list_namespaced_custom_object(GROUP, VERSION, "default", "modeldeployments")
        assert elsewhere.value.status == 403


def test_a_subprocess_emulator_serves_https_and_mints_tokens_for_masters_only() -> None:
    with EmulatorProcess(tls=True) as api:
        assert api.url.startswith("https://") and api.ca_pem is not None
        with api_client(api.kubeconfig_path) as kube:
            client.CoreV1Api(kube).create_namespaced_service_account(
                "default", service_account("x", "default")
            )
        ask = {"namespace": "default", "serviceAccount": "x", "nodeName": "gpu-1"}
        code, minted = https(api, "/emulator/tokens", api.token, ask)
        assert code == 201
        code, review = https(api, "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                             minted["token"], {"kind": "SelfSubjectReview"})  # fmt: skip
        assert code == 201
        assert review["status"]["userInfo"]["username"] == "system:serviceaccount:default:x"
        assert review["status"]["userInfo"]["extra"][NODE_NAME_EXTRA] == ["gpu-1"]
        assert https(api, "/emulator/tokens", minted["token"], ask)[0] == 403
