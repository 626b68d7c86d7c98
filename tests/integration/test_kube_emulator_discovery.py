"""The emulator starts fast, and its discovery, version and OpenAPI answers are what
clients resolve kinds and validation against; CRDs add and remove served resources."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import requests
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.kube_emulator.hosting import EmulatorProcess, EmulatorThread
from tests.support.kube_testing import EMULATOR_DATA, REPO_ROOT, api_client, load_yaml


@pytest.fixture
def api() -> Iterator[EmulatorThread]:
    with EmulatorThread() as api:
        yield api


@pytest.fixture
def kube(api: EmulatorThread) -> Iterator[client.ApiClient]:
    with api_client(api.kubeconfig_path) as kube:
        yield kube


def _process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_subprocess_starts_and_is_gone_after() -> None:
    began = time.monotonic()
    with EmulatorProcess() as api:
        ready_s = time.monotonic() - began
        kubeconfig = api.kubeconfig_path
        pid = api.pid
        with api_client(kubeconfig) as kube:
            names = [ns.metadata.name for ns in client.CoreV1Api(kube).list_namespace().items]
    assert ready_s < 10.0, f"took {ready_s:.2f}s to be ready"  # typically 0.3 s; no hang
    assert "default" in names
    assert not kubeconfig.exists()
    assert not _process_alive(pid)


def test_subprocess_loads_manifests_before_it_is_ready() -> None:
    crds = sorted((REPO_ROOT / "crds").glob("*.yaml"))
    with EmulatorProcess(manifests=crds) as api, api_client(api.kubeconfig_path) as kube:
        listed = client.CustomObjectsApi(kube).list_cluster_custom_object(
            "modelswap.io", "v1alpha1", "swapnodes"
        )
        kubeconfig = api.kubeconfig_path
        pid = api.pid
    assert listed["kind"] == "SwapNodeList" and listed["items"] == []
    assert not kubeconfig.exists()
    assert not _process_alive(pid)
    assert not kubeconfig.exists()
    assert not _process_alive(pid)


def test_in_thread_start_is_fast_and_serves_version() -> None:
    began = time.monotonic()
    with EmulatorThread() as other:
        ready_s = time.monotonic() - began
        version = requests.get(f"{other.url}/version", timeout=5).json()
    assert ready_s < 10.0  # typically well under a second; no hang
    assert version["major"] == "1" and int(version["minor"]) >= 30


def test_core_discovery_lists_builtins_with_short_names_verbs_and_subresources(
    kube: client.ApiClient,
) -> None:
    assert client.CoreApi(kube).get_api_versions().versions == ["v1"]
    resources = {r.name: r for r in client.CoreV1Api(kube).get_api_resources().resources}
    assert resources["namespaces"].namespaced is False
    assert "ns" in resources["namespaces"].short_names
    assert resources["configmaps"].namespaced is True
    assert set(resources["configmaps"].verbs) >= {"create", "get", "list", "watch", "patch"}
    assert resources["nodes/status"].verbs == ["get", "patch", "update"]
    for name in ("events", "secrets", "services", "nodes"):
        assert name in resources
    groups = {g.name: g for g in client.ApisApi(kube).get_api_versions().groups}
    assert groups["coordination.k8s.io"].preferred_version.group_version == "coordination.k8s.io/v1"
    assert "discovery.k8s.io" in groups and "apiextensions.k8s.io" in groups


def test_crd_registers_its_resources_and_deleting_it_drops_them(
    api: EmulatorThread, kube: client.ApiClient
) -> None:
    crd = load_yaml(EMULATOR_DATA / "widgets-crd.yaml")
    ext = client.ApiextensionsV1Api(kube)
    created = ext.create_custom_resource_definition(crd)
    assert created.metadata.generation == 1
    status = ext.read_custom_resource_definition("widgets.example.com").status
    assert {c.type: c.status for c in status.conditions}["Established"] == "True"
    resources = requests.get(f"{api.url}/apis/example.com/v1", timeout=5).json()["resources"]
    widgets = next(r for r in resources if r["name"] == "widgets")
    assert widgets["shortNames"] == ["wd"] and widgets["kind"] == "Widget"
    assert any(r["name"] == "widgets/status" for r in resources)
    custom = client.CustomObjectsApi(kube)
    body = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"color": "red"}}  # fmt: skip
    custom.create_namespaced_custom_object("example.com", "v1", "default", "widgets", body)

    ext.delete_custom_resource_definition("widgets.example.com")
    assert requests.get(f"{api.url}/apis/example.com/v1", timeout=5).status_code == 404
    with pytest.raises(ApiException) as e:
        custom.list_namespaced_custom_object("example.com", "v1", "default", "widgets")
    assert e.value.status == 404


def test_invalid_crd_is_refused(kube: client.ApiClient) -> None:
    crd = load_yaml(EMULATOR_DATA / "widgets-crd.yaml")
    crd["metadata"]["name"] = "widgets.wrong.com"
    with pytest.raises(ApiException) as e:
        client.ApiextensionsV1Api(kube).create_custom_resource_definition(crd)
    assert e.value.status == 422
    status = json.loads(e.value.body)
    assert 'must be spec.names.plural+"."+spec.group' in status["message"]
    assert status["details"]["causes"][0]["field"] == "metadata.name"


def test_openapi_v3_describes_crd_schema_and_field_validation(
    api: EmulatorThread, kube: client.ApiClient
) -> None:
    for path in sorted((REPO_ROOT / "crds").glob("*.yaml")):
        client.ApiextensionsV1Api(kube).create_custom_resource_definition(load_yaml(path))
    root = requests.get(f"{api.url}/openapi/v3", timeout=5).json()
    url = root["paths"]["apis/modelswap.io/v1alpha1"]["serverRelativeURL"]
    doc = requests.get(f"{api.url}{url}", timeout=5).json()
    schema = doc["components"]["schemas"]["io.modelswap.v1alpha1.ModelDeployment"]
    assert "swapPolicy" in schema["properties"]["spec"]["properties"]
    patch = doc["paths"][
        "/apis/modelswap.io/v1alpha1/namespaces/{namespace}/modeldeployments/{name}"
    ]["patch"]
    assert patch["x-kubernetes-group-version-kind"]["kind"] == "ModelDeployment"
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}
    assert "application/strategic-merge-patch+json" not in patch["requestBody"]["content"]
    v2 = requests.get(f"{api.url}/openapi/v2", timeout=5).json()
    assert "io.modelswap.v1alpha1.SwapNode" in v2["definitions"]


def test_aggregated_discovery_as_kubectl_asks_for_it(api: EmulatorThread) -> None:
    api.create(load_yaml(EMULATOR_DATA / "widgets-crd.yaml"))
    accept = (
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
    )
    apis = requests.get(f"{api.url}/apis", headers={"Accept": accept}, timeout=5)
    assert apis.headers["Content-Type"].startswith("application/json;g=apidiscovery.k8s.io;v=v2")
    groups = {g["metadata"]["name"]: g for g in apis.json()["items"]}
    (widgets,) = [
        r for r in groups["example.com"]["versions"][0]["resources"] if r["resource"] == "widgets"
    ]
    assert widgets["scope"] == "Namespaced" and widgets["shortNames"] == ["wd"]
    assert widgets["subresources"][0]["subresource"] == "status"
    core = requests.get(f"{api.url}/api", headers={"Accept": accept}, timeout=5).json()
    assert {r["resource"] for r in core["items"][0]["versions"][0]["resources"]} >= {
        "namespaces",
        "nodes",
    }
    legacy = requests.get(f"{api.url}/apis", timeout=5).json()
    assert legacy["kind"] == "APIGroupList"
