"""Watches as kopf and informers use them: initial state, resume from a resourceVersion,
selector transitions, bookmarks, timeouts, 410 for a compacted resourceVersion inside the
200 stream, and the end of the stream when the CRD goes away."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import EMULATOR_DATA, api_client, load_yaml
from tests.support.waiting import wait_for

G, V, P = "example.com", "v1", "widgets"
WIDGETS = f"/apis/{G}/{V}/namespaces/default/{P}"


@pytest.fixture
def api() -> Iterator[EmulatorThread]:
    with EmulatorThread(bookmark_interval_s=0.1) as api, api_client(api.kubeconfig_path) as kube:
        client.ApiextensionsV1Api(kube).create_custom_resource_definition(
            load_yaml(EMULATOR_DATA / "widgets-crd.yaml")
        )
        yield api


@pytest.fixture
def kube(api: EmulatorThread) -> Iterator[client.ApiClient]:
    with api_client(api.kubeconfig_path) as kube:
        yield kube


def widget(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": "Widget",
            "metadata": {"name": name, "labels": labels or {}}, "spec": {"color": "red"}}  # fmt: skip


def raw_events(
    api: EmulatorThread, path: str, params: dict[str, str], count: int
) -> list[dict[str, Any]]:
    """The first `count` events of a watch (the stream is bounded by timeoutSeconds)."""
    params = {"watch": "true", "timeoutSeconds": "5", **params}
    events = []
    with requests.get(f"{api.url}{path}", params=params, stream=True, timeout=10) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            events.append(json.loads(line))
            if len(events) == count:
                break
    return events


def test_resume_from_a_list_resource_version_replays_changes(
    api: EmulatorThread, kube: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(kube)
    custom.create_namespaced_custom_object(G, V, "default", P, widget("before"))
    listed = custom.list_namespaced_custom_object(G, V, "default", P)
    rv = listed["metadata"]["resourceVersion"]
    custom.create_namespaced_custom_object(G, V, "default", P, widget("a"))
    custom.patch_namespaced_custom_object(G, V, "default", P, "a", {"spec": {"size": 2}})
    custom.delete_namespaced_custom_object(G, V, "default", P, "a")
    stream = watch.Watch().stream(
        custom.list_namespaced_custom_object, G, V, "default", P,
        resource_version=rv, timeout_seconds=1,
    )  # fmt: skip
    seen = [(e["type"], e["object"]["metadata"]["name"]) for e in stream]
    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]


def test_watch_without_resource_version_starts_with_current_state(
    api: EmulatorThread, kube: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(kube)
    custom.create_namespaced_custom_object(G, V, "default", P, widget("x"))
    (event,) = raw_events(api, WIDGETS, {}, 1)
    assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "x"
    assert event["object"]["kind"] == "Widget"


def test_live_events_follow_label_selector_transitions(
    api: EmulatorThread, kube: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(kube)
    custom.create_namespaced_custom_object(G, V, "default", P, widget("w"))
    rv = custom.list_namespaced_custom_object(G, V, "default", P)["metadata"]["resourceVersion"]
    events: list[dict[str, Any]] = []
    ready = threading.Event()

    def consume() -> None:
        params = {"labelSelector": "tier=gold", "resourceVersion": rv}
        ready.set()
        events.extend(raw_events(api, WIDGETS, params, 2))

    reader = threading.Thread(target=consume)
    reader.start()
    ready.wait(5)
    custom.patch_namespaced_custom_object(
        G, V, "default", P, "w", {"metadata": {"labels": {"tier": "gold"}}}
    )
    custom.patch_namespaced_custom_object(
        G, V, "default", P, "w", {"metadata": {"labels": {"tier": "tin"}}}
    )
    reader.join(10)
    assert [e["type"] for e in events] == ["ADDED", "DELETED"]


def test_too_old_resource_version_is_an_error_event_in_a_200_stream(
    api: EmulatorThread, kube: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(kube)
    custom.create_namespaced_custom_object(G, V, "default", P, widget("old"))
    rv = custom.list_namespaced_custom_object(G, V, "default", P)["metadata"]["resourceVersion"]
    custom.patch_namespaced_custom_object(G, V, "default", P, "old", {"spec": {"size": 3}})
    api.call(api.emulator.cluster.store.compact)  # type: ignore[union-attr]
    (event,) = raw_events(api, WIDGETS, {"resourceVersion": rv}, 1)
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410 and event["object"]["reason"] == "Expired"
    assert event["object"]["message"].startswith(f"too old resource version: {rv}")


def test_bookmarks_carry_the_current_resource_version(
    api: EmulatorThread, kube: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(kube)
    made = custom.create_namespaced_custom_object(G, V, "default", P, widget("b"))
    rv = made["metadata"]["resourceVersion"]
    events = raw_events(api, WIDGETS, {"resourceVersion": rv, "allowWatchBookmarks": "true"}, 1)
    assert events[0]["type"] == "BOOKMARK"
    assert events[0]["object"]["metadata"]["resourceVersion"] == rv
    assert events[0]["object"]["kind"] == "Widget"


def test_watch_ends_at_timeout_seconds_and_when_the_crd_is_deleted(
    api: EmulatorThread, kube: client.ApiClient
) -> None:
    response = requests.get(
        f"{api.url}{WIDGETS}", params={"watch": "true", "timeoutSeconds": "1"}, timeout=10
    )  # returns only because the stream ends
    assert response.status_code == 200 and response.text == ""
    codes: list[int] = []

    def follow() -> None:
        params = {"watch": "true", "resourceVersion": "1", "timeoutSeconds": "30"}
        codes.append(requests.get(f"{api.url}{WIDGETS}", params=params, timeout=60).status_code)

    follower = threading.Thread(target=follow)
    follower.start()
    store = api.emulator.cluster.store  # type: ignore[union-attr]
    wait_for(lambda: api.call(lambda: store.watcher_count((G, P))), what="the watch to start")
    client.ApiextensionsV1Api(kube).delete_custom_resource_definition("widgets.example.com")
    follower.join(5)
    assert codes == [200], "the watch did not end when its CRD was deleted"


def test_official_client_watch_raises_410_for_a_compacted_resource_version(
    api: EmulatorThread, kube: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(kube)
    rv = custom.list_namespaced_custom_object(G, V, "default", P)["metadata"]["resourceVersion"]
    custom.create_namespaced_custom_object(G, V, "default", P, widget("gone"))
    api.call(api.emulator.cluster.store.compact)  # type: ignore[union-attr]
    stream = watch.Watch().stream(
        custom.list_namespaced_custom_object, G, V, "default", P,
        resource_version=rv, timeout_seconds=2,
    )  # fmt: skip
    with pytest.raises(ApiException) as e:
        list(stream)
    assert e.value.status == 410


def test_crds_are_watchable_and_report_established(api: EmulatorThread) -> None:
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    listed = requests.get(f"{api.url}{crds}", timeout=5).json()
    rv = listed["metadata"]["resourceVersion"]
    gadgets = load_yaml(EMULATOR_DATA / "gadgets-crd.yaml")
    assert requests.post(f"{api.url}{crds}", json=gadgets, timeout=5).status_code == 201
    added, established = raw_events(api, crds, {"resourceVersion": rv}, 2)
    assert added["type"] == "ADDED" and added["object"]["metadata"]["name"] == "gadgets.example.com"
    assert established["type"] == "MODIFIED"
    conditions = {c["type"]: c["status"] for c in established["object"]["status"]["conditions"]}
    assert conditions["Established"] == "True"
