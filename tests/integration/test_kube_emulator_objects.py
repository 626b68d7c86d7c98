"""Object semantics through the official client: metadata, optimistic concurrency, patches,
the status subresource, finalizers, dry-run, garbage collection and namespaces."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import EMULATOR_DATA, api_client, load_yaml

G, V, P = "example.com", "v1", "widgets"


@pytest.fixture
def kube() -> Iterator[client.ApiClient]:
    with EmulatorThread() as api, api_client(api.kubeconfig_path) as kube:
        api.create(load_yaml(EMULATOR_DATA / "widgets-crd.yaml"))  # seeded directly
        yield kube


def widget(name: str = "w", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"color": "red", **spec},
    }


def status_of(e: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(e.value.body)
    return body


def test_create_answers_201_with_server_set_metadata(kube: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(kube)
    obj, code, _ = custom.create_namespaced_custom_object_with_http_info(
        G, V, "default", P, widget()
    )
    assert code == 201
    meta = obj["metadata"]
    assert meta["namespace"] == "default"
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1 and int(meta["resourceVersion"]) > 0
    assert obj["spec"]["size"] == 1  # the schema default
    again = custom.patch_namespaced_custom_object(
        G, V, "default", P, "w", {"metadata": {"labels": {"a": "b"}}}
    )
    assert int(again["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert again["metadata"]["uid"] == meta["uid"]


def test_generate_name_and_namespace_rules(kube: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(kube)
    body = widget()
    body["metadata"] = {"generateName": "w-"}
    made = custom.create_namespaced_custom_object(G, V, "default", P, body)
    assert made["metadata"]["name"].startswith("w-") and len(made["metadata"]["name"]) == 7
    wrong_ns = widget("x")
    wrong_ns["metadata"]["namespace"] = "kube-system"
    with pytest.raises(ApiException) as e:
        custom.create_namespaced_custom_object(G, V, "default", P, wrong_ns)
    assert e.value.status == 400 and "does not match the namespace" in status_of(e)["message"]
    with pytest.raises(ApiException) as e:
        custom.create_namespaced_custom_object(G, V, "nowhere", P, widget("y"))
    assert e.value.status == 404 and status_of(e)["message"] == 'namespaces "nowhere" not found'
    with pytest.raises(ApiException) as e:
        custom.create_namespaced_custom_object(G, V, "default", P, widget(made["metadata"]["name"]))
    assert e.value.status == 409 and status_of(e)["reason"] == "AlreadyExists"


def test_put_needs_a_fresh_resource_version(kube: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(kube)
    first = custom.create_namespaced_custom_object(G, V, "default", P, widget())
    no_rv = widget(size=2)
    with pytest.raises(ApiException) as e:
        custom.replace_namespaced_custom_object(G, V, "default", P, "w", no_rv)
    assert e.value.status == 422
    assert (
        "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
        in (status_of(e)["message"])
    )
    custom.patch_namespaced_custom_object(G, V, "default", P, "w", {"spec": {"size": 3}})
    stale = dict(first, spec={"color": "red", "size": 4})
    with pytest.raises(ApiException) as e:
        custom.replace_namespaced_custom_object(G, V, "default", P, "w", stale)
    assert e.value.status == 409
    assert "the object has been modified" in status_of(e)["message"]
    fresh = custom.get_namespaced_custom_object(G, V, "default", P, "w")
    fresh["spec"]["size"] = 4
    replaced = custom.replace_namespaced_custom_object(G, V, "default", P, "w", fresh)
    assert replaced["spec"]["size"] == 4


def test_generation_counts_spec_changes_only(kube: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(kube)
    custom.create_namespaced_custom_object(G, V, "default", P, widget())
    labelled = custom.patch_namespaced_custom_object(
        G, V, "default", P, "w", {"metadata": {"labels": {"x": "y"}}}
    )
    assert labelled["metadata"]["generation"] == 1
    with_status = custom.patch_namespaced_custom_object_status(
        G, V, "default", P, "w", {"status": {"phase": "Ready"}}
    )
    assert with_status["metadata"]["generation"] == 1
    changed = custom.patch_namespaced_custom_object(G, V, "default", P, "w", {"spec": {"size": 5}})
    assert changed["metadata"]["generation"] == 2
    unchanged = custom.patch_namespaced_custom_object(
        G, V, "default", P, "w", {"spec": {"size": 5}}
    )
    assert unchanged["metadata"]["resourceVersion"] == changed["metadata"]["resourceVersion"]


def test_status_subresource_separates_status_from_the_rest(kube: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(kube)
    body = widget()
    body["status"] = {"phase": "Bogus"}
    created = custom.create_namespaced_custom_object(G, V, "default", P, body)
    assert "status" not in created  # create cannot set status
    main = custom.patch_namespaced_custom_object(
        G, V, "default", P, "w", {"spec": {"size": 2}, "status": {"phase": "Ignored"}}
    )
    assert main["spec"]["size"] == 2 and "status" not in main
    sub = custom.patch_namespaced_custom_object_status(
        G,
        V,
        "default",
        P,
        "w",
        {"spec": {"size": 9}, "status": {"phase": "Ready"}, "metadata": {"labels": {"l": "v"}}},
    )
    assert sub["status"] == {"phase": "Ready"}
    assert sub["spec"]["size"] == 2 and "labels" not in sub["metadata"]


def test_json_patch_with_test_op_and_strategic_merge_refused_on_custom(
    kube: client.ApiClient,
) -> None:
    custom = client.CustomObjectsApi(kube)
    created = custom.create_namespaced_custom_object(G, V, "default", P, widget())
    rv = created["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "replace", "path": "/spec/color", "value": "blue"},
    ]
    patched = custom.patch_namespaced_custom_object(
        G, V, "default", P, "w", ops, _content_type="application/json-patch+json"
    )
    assert patched["spec"]["color"] == "blue"
    with pytest.raises(ApiException) as e:  # the resourceVersion it tests is stale now
        custom.patch_namespaced_custom_object(
            G, V, "default", P, "w", ops, _content_type="application/json-patch+json"
        )
    assert e.value.status == 422 and "test failed" in status_of(e)["message"]
    with pytest.raises(ApiException) as e:
        custom.patch_namespaced_custom_object(
            G, V, "default", P, "w", {"spec": {"color": "green"}},
            _content_type="application/strategic-merge-patch+json",
        )  # fmt: skip
    assert e.value.status == 415


def test_strategic_merge_patch_on_builtins_merges_lists_by_key(kube: client.ApiClient) -> None:
    core = client.CoreV1Api(kube)
    svc = {
        "metadata": {"name": "s", "finalizers": ["a/b"]},
        "spec": {"ports": [{"name": "http", "port": 80}, {"name": "grpc", "port": 81}]},
    }
    core.create_namespaced_service("default", svc)
    core.patch_namespaced_service(
        "s", "default",
        {"metadata": {"finalizers": ["c/d"]},
         "spec": {"ports": [{"port": 81, "name": "grpc2"}, {"port": 90, "name": "new"}]}},
        _content_type="application/strategic-merge-patch+json",
    )  # fmt: skip
    got = core.read_namespaced_service("s", "default")
    assert [(p.port, p.name) for p in got.spec.ports] == [(80, "http"), (81, "grpc2"), (90, "new")]
    assert got.metadata.finalizers == ["a/b", "c/d"]


def test_finalizers_hold_deletion_until_removed(kube: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(kube)
    body = widget()
    body["metadata"]["finalizers"] = ["example.com/cleanup"]
    custom.create_namespaced_custom_object(G, V, "default", P, body)
    custom.delete_namespaced_custom_object(G, V, "default", P, "w")
    held = custom.get_namespaced_custom_object(G, V, "default", P, "w")
    assert held["metadata"]["deletionTimestamp"]
    assert held["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as e:
        custom.patch_namespaced_custom_object(
            G,
            V,
            "default",
            P,
            "w",
            {"metadata": {"finalizers": ["example.com/cleanup", "new/one"]}},
        )
    assert e.value.status == 422 and "no new finalizers" in status_of(e)["message"]
    custom.patch_namespaced_custom_object(
        G, V, "default", P, "w", {"metadata": {"finalizers": None}}
    )
    with pytest.raises(ApiException) as e:
        custom.get_namespaced_custom_object(G, V, "default", P, "w")
    assert e.value.status == 404


def test_dry_run_changes_nothing(kube: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(kube)
    dry = custom.create_namespaced_custom_object(G, V, "default", P, widget("d"), dry_run="All")
    assert dry["metadata"]["name"] == "d"
    assert custom.list_namespaced_custom_object(G, V, "default", P)["items"] == []
    created = custom.create_namespaced_custom_object(G, V, "default", P, widget())
    rv = created["metadata"]["resourceVersion"]
    patched = custom.patch_namespaced_custom_object(
        G, V, "default", P, "w", {"spec": {"size": 7}}, dry_run="All"
    )
    assert patched["spec"]["size"] == 7
    custom.delete_namespaced_custom_object(G, V, "default", P, "w", dry_run="All")
    now = custom.get_namespaced_custom_object(G, V, "default", P, "w")
    assert now["spec"]["size"] == 1 and now["metadata"]["resourceVersion"] == rv


def test_owner_deletion_collects_dependents(kube: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(kube)
    owner = custom.create_namespaced_custom_object(G, V, "default", P, widget())
    ref = {"apiVersion": f"{G}/{V}", "kind": "Widget", "name": "w", "uid": owner["metadata"]["uid"]}
    core = client.CoreV1Api(kube)
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": "dep", "ownerReferences": [ref]}}
    )
    core.create_namespaced_config_map("default", {"metadata": {"name": "free"}})
    custom.delete_namespaced_custom_object(G, V, "default", P, "w")
    names = [cm.metadata.name for cm in core.list_namespaced_config_map("default").items]
    assert names == ["free"]


def test_namespace_deletion_removes_its_contents(kube: client.ApiClient) -> None:
    core = client.CoreV1Api(kube)
    created = core.create_namespace({"metadata": {"name": "team"}})
    assert created.status.phase == "Active"
    assert created.metadata.labels["kubernetes.io/metadata.name"] == "team"
    core.create_namespaced_secret("team", {"metadata": {"name": "s"}, "stringData": {"a": "b"}})
    core.delete_namespace("team")
    with pytest.raises(ApiException) as e:
        core.read_namespace("team")
    assert e.value.status == 404
    assert core.list_secret_for_all_namespaces().items == []


def test_lists_filter_by_labels_and_fields_and_page(kube: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(kube)
    for name, tier, color in (("a", "gold", "red"), ("b", "silver", "blue"), ("c", "gold", "blue")):
        body = widget(name, color=color)
        body["metadata"]["labels"] = {"tier": tier}
        custom.create_namespaced_custom_object(G, V, "default", P, body)

    def names(**kwargs: Any) -> list[str]:
        listed = custom.list_namespaced_custom_object(G, V, "default", P, **kwargs)
        assert listed["kind"] == "WidgetList" and listed["apiVersion"] == f"{G}/{V}"
        return [i["metadata"]["name"] for i in listed["items"]]

    assert names(label_selector="tier=gold") == ["a", "c"]
    assert names(label_selector="tier in (silver),tier!=gold") == ["b"]
    assert names(label_selector="!tier") == []
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="spec.color=blue") == ["b", "c"]  # a CRD selectableField
    with pytest.raises(ApiException) as e:
        names(field_selector="spec.size=1")
    assert e.value.status == 400 and "field label not supported" in status_of(e)["message"]
    page = custom.list_namespaced_custom_object(G, V, "default", P, limit=2)
    assert [i["metadata"]["name"] for i in page["items"]] == ["a", "b"]
    rest = custom.list_namespaced_custom_object(
        G, V, "default", P, limit=2, _continue=page["metadata"]["continue"]
    )
    assert [i["metadata"]["name"] for i in rest["items"]] == ["c"]
    core_list = client.CoreV1Api(kube).list_namespace()
    assert core_list.kind == "NamespaceList" and core_list.api_version == "v1"


def test_cluster_scoped_custom_resources(kube: client.ApiClient) -> None:
    client.ApiextensionsV1Api(kube).create_custom_resource_definition(
        load_yaml(EMULATOR_DATA / "gadgets-crd.yaml")
    )
    custom = client.CustomObjectsApi(kube)
    body = {
        "apiVersion": "example.com/v1",
        "kind": "Gadget",
        "metadata": {"name": "g"},
        "spec": {"any": 1},
    }
    made = custom.create_cluster_custom_object(G, V, "gadgets", body)
    assert "namespace" not in made["metadata"]
    assert custom.list_cluster_custom_object(G, V, "gadgets")["items"][0]["spec"] == {"any": 1}
