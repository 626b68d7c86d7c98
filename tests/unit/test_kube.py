import base64
import socket
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelswap_api import crds, kube
from modelswap_api.errors import KubeConfigError
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import REPO_ROOT, load_yaml


def test_api_client_reads_an_explicit_kubeconfig(tmp_path: Path) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:6553"}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    api = kube.api_client(str(path))
    assert api.configuration.host == "http://127.0.0.1:6553"
    assert api.configuration.auth_settings()["BearerToken"]["value"] == "Bearer t0ken"
    assert kube.custom_objects(api).api_client is api


def test_an_unusable_config_is_a_kube_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Callers catch it without importing the client's exception (only kube may).
    with pytest.raises(kube.KubeError) as raised:
        kube.api_client(str(tmp_path / "missing"))
    assert type(raised.value).__name__ == "KubeConfigError" and raised.value.status is None
    assert "No configuration found" in str(raised.value)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="Service host/port is not set"):
        kube.api_client(None)


def test_each_helper_is_named_as_callers_name_it() -> None:
    # The operator labels its kube_calls metric with a helper's __name__, and tests' fake
    # clusters answer by it: a helper built from a kind's generic method keeps its own.
    helpers = {name: value for name, value in vars(kube).items()
               if name.split("_")[0] in ("read", "create", "patch", "replace", "delete",
                                         "list", "scale") and callable(value)}  # fmt: skip
    assert len(helpers) == 29
    assert all(helper.__name__ == name and helper.__doc__ for name, helper in helpers.items())


# The typed helpers, against the API emulator in a thread: each helper's answer, the
# NotFound / Conflict mapping callers rely on, and that a Secret's data never reaches an
# error message (errors are logged and turned into Events).

NAMESPACE = "team-a"
SECRET_VALUE = "s3cr3t-model-token"


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmulatorThread]:
    with EmulatorThread() as emulator:
        for crd in ("modelswap.io_modeldeployments.yaml", "modelswap.io_swapnodes.yaml"):
            emulator.create(load_yaml(REPO_ROOT / "crds" / crd))
        emulator.create({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": NAMESPACE}})  # fmt: skip
        yield emulator


@pytest.fixture(scope="module")
def api(cluster: EmulatorThread) -> Iterator[Any]:
    made: Any = kube.api_client(str(cluster.kubeconfig_path))
    yield made
    made.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def model_deployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": crds.API_VERSION,
        "kind": crds.MODEL_DEPLOYMENT,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"model": {"runtime": "triton", "source": {"uri": "/models/tinylm"},
                           "weightsBytes": "64Mi"}},
    }  # fmt: skip


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {"app": "modelswap"}},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8000}]},
    }


def endpoint_slice(name: str, address: str) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
    }


def lease(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }


def test_model_deployment_metadata_and_status_are_patched_apart(
    cluster: EmulatorThread, api: Any
) -> None:
    name = unique("md")
    assert kube.read_model_deployment(api, NAMESPACE, name) is None
    cluster.create(model_deployment(name))

    patched = kube.patch_model_deployment(
        api, NAMESPACE, name,
        {"metadata": {"finalizers": ["modelswap.io/cleanup"], "annotations": {"a": "1"}}},
    )  # fmt: skip
    assert patched["metadata"]["finalizers"] == ["modelswap.io/cleanup"]
    generation = patched["metadata"]["generation"]

    first = {"status": {"phase": "Placed", "node": "node-a", "observedGeneration": generation}}
    kube.patch_model_deployment_status(api, NAMESPACE, name, first)
    kube.patch_model_deployment_status(api, NAMESPACE, name, {"status": {"node": None}})
    read = kube.read_model_deployment(api, NAMESPACE, name)
    assert read is not None
    assert read["status"] == {"phase": "Placed", "observedGeneration": generation}
    assert read["metadata"]["annotations"] == {"a": "1"}
    assert read["metadata"]["generation"] == generation  # a status write is no spec change
    assert read["spec"]["model"]["weightsBytes"] == "64Mi"

    with pytest.raises(kube.NotFound):
        kube.patch_model_deployment_status(api, NAMESPACE, unique("gone"), first)
    with pytest.raises(kube.NotFound):
        kube.patch_model_deployment(api, NAMESPACE, unique("gone"), {"metadata": {}})


def test_list_model_deployments_per_namespace_and_everywhere(
    cluster: EmulatorThread, api: Any
) -> None:
    name = unique("md")
    cluster.create(model_deployment(name))
    here = {md["metadata"]["name"] for md in kube.list_model_deployments(api, NAMESPACE)}
    everywhere = {
        (md["metadata"]["namespace"], md["metadata"]["name"])
        for md in kube.list_model_deployments(api, None)
    }
    assert name in here and (NAMESPACE, name) in everywhere
    assert kube.list_model_deployments(api, "default") == []


def test_list_swapnodes_answers_every_swapnode(cluster: EmulatorThread, api: Any) -> None:
    names = {unique("node"), unique("node")}
    before = {s["metadata"]["name"] for s in kube.list_swapnodes(api)}
    for name in names:
        kube.create_swapnode(api, {"apiVersion": crds.API_VERSION, "kind": crds.SWAP_NODE,
                                   "metadata": {"name": name}, "spec": {"nodeName": name}})  # fmt: skip
    after = {s["metadata"]["name"] for s in kube.list_swapnodes(api)}
    assert after == before | names


def test_service_create_patch_delete(api: Any) -> None:
    name = unique("svc")
    assert kube.read_service(api, NAMESPACE, name) is None
    created = kube.create_service(api, NAMESPACE, service(name))
    assert created["metadata"]["namespace"] == NAMESPACE
    with pytest.raises(kube.Conflict):
        kube.create_service(api, NAMESPACE, service(name))

    ports = [{"name": "http", "port": 80, "targetPort": 9000}]
    kube.patch_service(api, NAMESPACE, name, {"metadata": {"labels": {"b": "2"}},
                                              "spec": {"ports": ports}})  # fmt: skip
    read = kube.read_service(api, NAMESPACE, name)
    assert read is not None
    assert read["metadata"]["labels"] == {"app": "modelswap", "b": "2"}
    assert [p["targetPort"] for p in read["spec"]["ports"]] == [9000]

    assert kube.delete_service(api, NAMESPACE, name) is True
    assert kube.delete_service(api, NAMESPACE, name) is False
    assert kube.read_service(api, NAMESPACE, name) is None
    with pytest.raises(kube.NotFound):
        kube.patch_service(api, NAMESPACE, name, {"metadata": {"labels": {"b": "3"}}})


def test_endpoint_slice_replace_needs_the_current_resource_version(api: Any) -> None:
    name = unique("eps")
    assert kube.read_endpoint_slice(api, NAMESPACE, name) is None
    created = kube.create_endpoint_slice(api, NAMESPACE, endpoint_slice(name, "10.0.0.1"))
    with pytest.raises(kube.Conflict):
        kube.create_endpoint_slice(api, NAMESPACE, endpoint_slice(name, "10.0.0.1"))

    moved = endpoint_slice(name, "10.0.0.2")
    moved["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    replaced = kube.replace_endpoint_slice(api, NAMESPACE, moved)
    assert replaced["endpoints"][0]["addresses"] == ["10.0.0.2"]
    with pytest.raises(kube.Conflict):  # a writer that read before the first replace
        kube.replace_endpoint_slice(api, NAMESPACE, moved)
    read = kube.read_endpoint_slice(api, NAMESPACE, name)
    assert read is not None and read["endpoints"][0]["addresses"] == ["10.0.0.2"]

    assert kube.delete_endpoint_slice(api, NAMESPACE, name) is True
    assert kube.delete_endpoint_slice(api, NAMESPACE, name) is False


def test_secret_read_create_and_conflict(api: Any) -> None:
    name = unique("creds")
    assert kube.read_secret(api, NAMESPACE, name) is None
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "data": {"token": base64.b64encode(SECRET_VALUE.encode()).decode()}}  # fmt: skip
    kube.create_secret(api, NAMESPACE, body)
    read = kube.read_secret(api, NAMESPACE, name)
    assert read is not None
    assert base64.b64decode(read["data"]["token"]).decode() == SECRET_VALUE
    with pytest.raises(kube.Conflict) as raised:
        kube.create_secret(api, NAMESPACE, body)
    assert name in str(raised.value)
    assert_no_secret_in(raised.value)


def test_a_refused_secret_body_names_the_field_not_the_value(api: Any) -> None:
    # The client checks the body before sending it; its own error would quote the value.
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": unique("creds")},
            "data": {"token": ["not", SECRET_VALUE]}}  # fmt: skip
    with pytest.raises(kube.KubeError) as raised:
        kube.create_secret(api, NAMESPACE, body)
    assert "token" in str(raised.value)
    assert_no_secret_in(raised.value)
    assert raised.value.__suppress_context__


def assert_no_secret_in(error: BaseException) -> None:
    encoded = base64.b64encode(SECRET_VALUE.encode()).decode()
    shown = "".join(traceback.format_exception(error))
    assert SECRET_VALUE not in shown and encoded not in shown


def test_leases_are_listed_per_namespace(api: Any) -> None:
    names = {unique("lease"), unique("lease")}
    for name in names:
        kube.create_lease(api, NAMESPACE, lease(name))
    with pytest.raises(kube.Conflict):
        kube.create_lease(api, NAMESPACE, lease(next(iter(names))))
    listed = {item["metadata"]["name"] for item in kube.list_leases(api, NAMESPACE)}
    assert names <= listed
    assert not names & {item["metadata"]["name"] for item in kube.list_leases(api, "default")}
    assert kube.list_leases(api, unique("empty")) == []


def test_create_event_and_read_namespace(api: Any) -> None:
    involved = {"apiVersion": crds.API_VERSION, "kind": crds.MODEL_DEPLOYMENT,
                "namespace": NAMESPACE, "name": "chat", "uid": str(uuid.uuid4())}  # fmt: skip
    event = kube.create_event(api, NAMESPACE, {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": "chat."},
        "involvedObject": involved,
        "reason": "Placed", "message": "placed on node-a", "type": "Normal",
    })  # fmt: skip
    assert event["metadata"]["name"].startswith("chat.")
    assert event["involvedObject"]["uid"] == involved["uid"]
    assert event["reason"] == "Placed"

    namespace = kube.read_namespace(api, NAMESPACE)
    assert namespace is not None and namespace["metadata"]["name"] == NAMESPACE
    assert kube.read_namespace(api, unique("missing")) is None


def test_an_unreachable_server_is_a_kube_error_without_status(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    api: Any = kube.api_client(str(path))
    with pytest.raises(kube.KubeError) as raised:
        kube.read_service(api, NAMESPACE, "x", timeout_seconds=2)
    assert raised.value.status is None and not isinstance(raised.value, kube.NotFound)
    assert "unreachable" in str(raised.value)
    api.close()
