"""A kopf operator under `kopf.testing.KopfRunner` against the emulator: the behaviours the
real operator depends on (handlers, status patches, finalizers, concurrent writers, 409 on a
stale PUT) work as against a real API server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kopf.testing import KopfRunner
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_smoke_operator import RESOURCE, SMOKE_NODE, SmokeRecord, register, settings
from tests.support.kube_testing import REPO_ROOT, api_client, load_yaml
from tests.support.waiting import wait_for

G, V, P = RESOURCE
FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
EXAMPLE = REPO_ROOT / "examples" / "toy" / "classify-drop-on-idle.yaml"


@pytest.fixture
def api() -> Iterator[EmulatorThread]:
    with EmulatorThread() as api, api_client(api.kubeconfig_path) as kube:
        ext = client.ApiextensionsV1Api(kube)
        for path in sorted((REPO_ROOT / "crds").glob("*.yaml")):
            ext.create_custom_resource_definition(load_yaml(path))
        yield api


@pytest.fixture
def custom(api: EmulatorThread) -> Iterator[client.CustomObjectsApi]:
    with api_client(api.kubeconfig_path) as kube:
        yield client.CustomObjectsApi(kube)


@pytest.fixture
def operator(api: EmulatorThread) -> Iterator[SmokeRecord]:
    record = SmokeRecord()
    registry = kopf.OperatorRegistry()
    register(registry, api.kubeconfig_path, record)
    args = ["run", "--standalone", "--namespace=default"]
    configured = settings(post_events=True)
    with KopfRunner(args, registry=registry, settings=configured, timeout=30) as runner:
        yield record
    assert runner.exception is None
    assert runner.exit_code == 0


def get(custom: client.CustomObjectsApi, name: str = "classify") -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = custom.get_namespaced_custom_object(G, V, "default", P, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return obj


def observed(custom: client.CustomObjectsApi, generation: int) -> dict[str, Any] | None:
    obj = get(custom)
    status = (obj or {}).get("status") or {}
    return obj if status.get("observedGeneration") == generation else None


def events_about(api: EmulatorThread, name: str) -> list[str]:
    with api_client(api.kubeconfig_path) as kube:
        found = client.CoreV1Api(kube).list_namespaced_event(
            "default", field_selector=f"involvedObject.name={name}"
        )
    return [e.message for e in found.items if "succeeded" in (e.message or "")]


def test_create_runs_handler_patches_status_and_adds_finalizer(
    api: EmulatorThread, operator: SmokeRecord, custom: client.CustomObjectsApi
) -> None:
    custom.create_namespaced_custom_object(G, V, "default", P, load_yaml(EXAMPLE))
    obj = wait_for(lambda: observed(custom, 1), what="the status patch")
    assert obj["status"]["phase"] == "Placed" and obj["status"]["node"] == SMOKE_NODE
    assert FINALIZER in obj["metadata"]["finalizers"]
    assert operator.created == ["classify"]
    wait_for(lambda: events_about(api, "classify"), what="kopf's Event about the handler")

    custom.delete_namespaced_custom_object(G, V, "default", P, "classify")
    wait_for(lambda: get(custom) is None, what="the object to be gone")
    assert operator.deleted == ["classify"]


def test_concurrent_writers_keep_each_others_fields(
    operator: SmokeRecord, custom: client.CustomObjectsApi
) -> None:
    custom.create_namespaced_custom_object(G, V, "default", P, load_yaml(EXAMPLE))
    wait_for(lambda: observed(custom, 1), what="the first status patch")
    labels = threading.Thread(
        target=lambda: [
            custom.patch_namespaced_custom_object(
                G, V, "default", P, "classify", {"metadata": {"labels": {f"l{i}": "x"}}}
            )
            for i in range(10)
        ]
    )
    labels.start()  # labels written while the operator reacts to a spec change
    custom.patch_namespaced_custom_object(
        G, V, "default", P, "classify", {"spec": {"swapPolicy": {"priority": 42}}}
    )
    labels.join(30)
    obj = wait_for(lambda: observed(custom, 2), what="the operator to observe generation 2")
    assert obj["spec"]["swapPolicy"]["priority"] == 42
    assert all(obj["metadata"]["labels"][f"l{i}"] == "x" for i in range(10))
    assert obj["status"]["phase"] == "Placed"


def test_stale_put_gets_409_and_a_fresh_retry_succeeds(
    operator: SmokeRecord, custom: client.CustomObjectsApi
) -> None:
    custom.create_namespaced_custom_object(G, V, "default", P, load_yaml(EXAMPLE))
    stale = wait_for(lambda: observed(custom, 1), what="the first status patch")
    custom.patch_namespaced_custom_object(
        G, V, "default", P, "classify", {"spec": {"swapPolicy": {"priority": 7}}}
    )
    wait_for(lambda: observed(custom, 2), what="the operator's status write")
    stale["spec"]["swapPolicy"]["priority"] = 99
    with pytest.raises(ApiException) as e:
        custom.replace_namespaced_custom_object(G, V, "default", P, "classify", stale)
    assert e.value.status == 409
    assert json.loads(e.value.body)["reason"] == "Conflict"
    fresh = get(custom)
    assert fresh is not None
    fresh["spec"]["swapPolicy"]["priority"] = 99
    replaced = custom.replace_namespaced_custom_object(G, V, "default", P, "classify", fresh)
    assert replaced["spec"]["swapPolicy"]["priority"] == 99
    obj = wait_for(lambda: observed(custom, 3), what="the operator to see the retried PUT")
    assert obj["status"]["phase"] == "Placed"  # the PUT of the main resource kept status
