"""Custom objects are validated as the real server does it: schema and CEL through
modelswap's validator (422 with one cause per field), unknown fields by `fieldValidation`,
and lists print as server-side Tables from the CRD's printer columns."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import EMULATOR_DATA, REPO_ROOT, api_client, load_yaml

G, V = "modelswap.io", "v1alpha1"
INVALID = sorted((REPO_ROOT / "tests" / "data" / "invalid").glob("*.yaml"))


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorThread]:
    with EmulatorThread() as api, api_client(api.kubeconfig_path) as kube:
        ext = client.ApiextensionsV1Api(kube)
        for path in [
            *sorted((REPO_ROOT / "crds").glob("*.yaml")),
            EMULATOR_DATA / "widgets-crd.yaml",
        ]:
            ext.create_custom_resource_definition(load_yaml(path))
        yield api


@pytest.fixture
def kube(emulator: EmulatorThread) -> Iterator[client.ApiClient]:
    with api_client(emulator.kubeconfig_path) as kube:
        yield kube


def expected_field(path: Path) -> str:
    found = re.search(r"^# expect: (\S+)", path.read_text(), re.MULTILINE)
    assert found, f"{path} names no expected field"
    return found.group(1)


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_each_invalid_example_is_refused_naming_its_field(
    kube: client.ApiClient, path: Path
) -> None:
    body = load_yaml(path)
    with pytest.raises(ApiException) as e:
        client.CustomObjectsApi(kube).create_namespaced_custom_object(
            G, V, "default", "modeldeployments", body, field_validation="Strict"
        )
    status = json.loads(e.value.body)
    field = expected_field(path)
    if e.value.status == 400:  # an unknown field under Strict
        assert f'strict decoding error: unknown field "{field}"' in status["message"]
    else:
        assert e.value.status == 422, status
        assert field in [c["field"] for c in status["details"]["causes"]]
        name = body["metadata"]["name"]
        assert status["message"].startswith(f'ModelDeployment.modelswap.io "{name}" is invalid: ')
        assert status["details"]["kind"] == "ModelDeployment"


def test_every_example_is_accepted(kube: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(kube)
    folder = REPO_ROOT / "examples"
    examples = sorted(folder.glob("*.yaml")) + sorted((folder / "toy").glob("*.yaml"))
    assert examples
    for path in examples:
        body = load_yaml(path)
        ns = body["metadata"].get("namespace", "default")
        made = custom.create_namespaced_custom_object(
            G, V, ns, "modeldeployments", body, field_validation="Strict", dry_run="All"
        )
        assert made["spec"]["model"] == body["spec"]["model"]


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name},
            "spec": {"color": "red", **spec}}  # fmt: skip


def test_several_errors_are_all_named(kube: client.ApiClient) -> None:
    with pytest.raises(ApiException) as e:
        client.CustomObjectsApi(kube).create_namespaced_custom_object(
            "example.com", "v1", "default", "widgets", widget("bad", color="RED", size=-1)
        )
    status = json.loads(e.value.body)
    assert e.value.status == 422
    assert {c["field"] for c in status["details"]["causes"]} == {"spec.color", "spec.size"}
    assert re.match(r'^Widget\.example\.com "bad" is invalid: \[spec\.\w+: .*, spec\.\w+: .*\]$',
                    status["message"])  # fmt: skip


def test_cel_rule_refuses_with_its_message(kube: client.ApiClient) -> None:
    with pytest.raises(ApiException) as e:
        client.CustomObjectsApi(kube).create_namespaced_custom_object(
            "example.com", "v1", "default", "widgets", widget("cel", size=5, maxSize=2)
        )
    causes = json.loads(e.value.body)["details"]["causes"]
    assert any("size must not exceed maxSize" in c["message"] for c in causes)


def test_field_validation_strict_warn_ignore(
    emulator: EmulatorThread, kube: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(kube)
    with pytest.raises(ApiException) as e:
        custom.create_namespaced_custom_object(
            "example.com",
            "v1",
            "default",
            "widgets",
            widget("s", extra=1),
            field_validation="Strict",
        )
    assert e.value.status == 400
    assert json.loads(e.value.body)["message"] == (
        'Widget in version "v1" cannot be handled as a Widget: strict decoding error: '
        'unknown field "spec.extra"'
    )
    url = f"{emulator.url}/apis/example.com/v1/namespaces/default/widgets"
    warned = requests.post(
        url, params={"fieldValidation": "Warn"}, json=widget("w", extra=1), timeout=5
    )
    assert warned.status_code == 201
    assert warned.headers["Warning"] == '299 - "unknown field \\"spec.extra\\""'
    assert "extra" not in warned.json()["spec"]
    ignored = custom.create_namespaced_custom_object(
        "example.com",
        "v1",
        "default",
        "widgets",
        widget("i", extra=1),
        field_validation="Ignore",
    )
    assert "extra" not in ignored["spec"]
    with pytest.raises(ApiException) as e:
        custom.patch_namespaced_custom_object(
            "example.com", "v1", "default", "widgets", "i", {"spec": {"other": 2}},
            field_validation="Strict",
        )  # fmt: skip
    assert e.value.status == 400
    assert (
        'strict decoding error: unknown field "spec.other"' in json.loads(e.value.body)["message"]
    )


def test_table_output_uses_printer_columns(
    emulator: EmulatorThread, kube: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(kube)
    custom.create_namespaced_custom_object(
        "example.com", "v1", "default", "widgets", widget("t", size=3)
    )
    custom.patch_namespaced_custom_object_status(
        "example.com", "v1", "default", "widgets", "t", {"status": {"phase": "Ready"}}
    )
    headers = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
    table = requests.get(
        f"{emulator.url}/apis/example.com/v1/namespaces/default/widgets",
        params={"fieldSelector": "metadata.name=t"}, headers=headers, timeout=5,
    ).json()  # fmt: skip
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name",
        "Color",
        "Size",
        "Phase",
        "Age",
    ]
    (row,) = table["rows"]
    assert row["cells"][:4] == ["t", "red", 3, "Ready"]
    assert re.fullmatch(r"\d+s", row["cells"][4])
    assert row["object"]["kind"] == "PartialObjectMetadata"
