"""docs/control-api.openapi.yaml against the app's routes, the wire types and real answers."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import validate as validate_openapi

from modelswap_api import codec, control, models
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.policy import effective_policy
from modelswap_sidecar.control.app import make_app, openapi_text
from modelswap_sidecar.control.auth import TokenFile
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings
from tests.support.memory_backend import InMemoryBackend

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = ROOT / "docs" / "control-api.openapi.yaml"
METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}
GiB = 1 << 30

#: Every schema of the document that mirrors a wire type.
WIRE_TYPES: dict[str, type[Any]] = {
    "Revision": control.Revision,
    "SourceCredentials": control.SourceCredentials,
    "DesiredEntry": control.DesiredEntry,
    "DesiredSet": control.DesiredSet,
    "EntryResult": control.EntryResult,
    "PendingUnload": control.PendingUnload,
    "DesiredSetResult": control.DesiredSetResult,
    "ModelInfo": control.ModelInfo,
    "ModelList": control.ModelList,
    "NodeInfo": control.NodeInfo,
    "ActionResult": control.ActionResult,
    "Cause": control.Cause,
    "ErrorBody": control.ErrorBody,
    "EffectivePolicy": models.EffectivePolicyStatus,
    "GpuStatus": models.GpuStatus,
    "Link": models.Link,
}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(DOCUMENT.read_text())
    return loaded


def schema_validator(document: dict[str, Any], schema: dict[str, Any]) -> jsonschema.Validator:
    rooted = {**schema, "components": document["components"]}
    return jsonschema.Draft202012Validator(
        rooted, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield path, method, operation


def resolve(document: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = document
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def test_the_document_is_valid_openapi_3_1_and_is_what_the_agent_serves(
    document: dict[str, Any],
) -> None:
    validate_openapi(document)
    assert document["openapi"].startswith("3.1")
    assert openapi_text() == DOCUMENT.read_text()


def test_every_route_is_documented_and_every_documented_route_exists(
    document: dict[str, Any], tmp_path: Path
) -> None:
    app = make_app(service(tmp_path), TokenFile(tmp_path / "token"))
    served = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None
    }
    documented = {(method, path) for path, method, _ in operations(document)}
    assert served == documented


def test_schemas_mirror_the_wire_types(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    for name, cls in WIRE_TYPES.items():
        fields = dataclasses.fields(cls)
        schema = schemas[name]
        assert set(schema["properties"]) == {codec.wire_name(f) for f in fields}, name
        required = {
            codec.wire_name(f)
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        assert set(schema.get("required", ())) == required, name
        hints = typing.get_type_hints(cls)
        for f in fields:
            if typing.get_origin(hints[f.name]) is typing.Literal:
                enum = schema["properties"][codec.wire_name(f)]["enum"]
                assert set(enum) == set(typing.get_args(hints[f.name])), f"{name}.{f.name}"


def test_every_example_validates_against_its_schema(document: dict[str, Any]) -> None:
    checked = 0
    media_types = [
        media
        for _, _, operation in operations(document)
        for media in _media_types(document, operation)
    ]
    media_types += [
        media
        for response in document["components"]["responses"].values()
        for media in response.get("content", {}).values()
    ]
    for media in media_types:
        if "example" in media:
            schema_validator(document, media["schema"]).validate(media["example"])
            checked += 1
    assert checked >= 8
    put = document["paths"]["/v1/desired"]["put"]
    example = put["requestBody"]["content"]["application/json"]["example"]
    parsed = control.parse_desired_set(example)  # the spec passes the CRD's own checks too
    assert parsed.entries[0].spec.model.weights_bytes.bytes == 16 * GiB
    assert "bearerToken" in example["entries"][0]["credentials"]
    assert "…" not in repr(parsed)  # secrets stay out of reprs (and logs)


def _media_types(document: dict[str, Any], operation: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from operation.get("requestBody", {}).get("content", {}).values()
    for response in operation["responses"].values():
        yield from resolve(document, response).get("content", {}).values()


@pytest.mark.asyncio
async def test_real_answers_are_documented_and_match_their_schemas(
    document: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "token").write_text("t")
    auth = {"Authorization": "Bearer t"}
    app = make_app(service(tmp_path), TokenFile(tmp_path / "token"))
    spec = {"model": {"source": {"uri": "/m"}, "weightsBytes": "1Gi"}}
    pinned = {**spec, "swapPolicy": {"idleAfter": "never", "pinned": True}}
    #: Kubernetes UIDs, by the names of the models they stand for.
    uids = {label: f"00000000-0000-4000-8000-{n:012x}" for n, label in enumerate(["a", "p", "big", "zzz", "gone"])}  # fmt: skip
    labels = {uid: label for label, uid in uids.items()}

    def entry(uid: str, body: dict[str, Any]) -> dict[str, Any]:
        policy = effective_policy(body, BUILTIN_DEFAULTS).to_status().to_dict()
        return {"uid": uid, "namespace": "ns", "name": labels[uid], "generation": 1,
                "spec": body, "policy": policy}  # fmt: skip

    calls: list[tuple[str, str, str, Any, dict[str, str]]] = [
        ("put", "/v1/desired", "/v1/desired", {"revision": {"term": 2, "counter": 1},
         "entries": [entry(uids["a"], spec), entry(uids["p"], pinned), entry(uids["big"], {**spec, "model": {**spec["model"], "weightsBytes": "20Gi"}})]}, auth),
        ("put", "/v1/desired", "/v1/desired", {"revision": {"term": 1, "counter": 1}, "entries": []}, auth),
        ("put", "/v1/desired", "/v1/desired", {"revision": {"term": 2}}, auth),
        ("put", "/v1/desired", "/v1/desired", {"revision": {"term": 2, "counter": 2}, "entries": [entry(uids["a"], {**spec, "bogus": 1})]}, auth),
        ("get", "/v1/node", "/v1/node", None, auth),
        ("get", "/v1/node", "/v1/node", None, {}),
        ("get", "/v1/node", "/v1/node", None, {"Authorization": "Bearer nope"}),
        ("get", "/v1/models", "/v1/models", None, auth),
        ("get", "/v1/models/{uid}", f"/v1/models/{uids['a']}", None, auth),
        ("get", "/v1/models/{uid}", f"/v1/models/{uids['zzz']}", None, auth),
        ("get", "/v1/models/{uid}", "/v1/models/.bad", None, auth),
        ("post", "/v1/models/{uid}/swap-out", f"/v1/models/{uids['a']}/swap-out", None, auth),
        ("post", "/v1/models/{uid}/swap-out", f"/v1/models/{uids['p']}/swap-out", None, auth),
        ("post", "/v1/models/{uid}/swap-in", f"/v1/models/{uids['a']}/swap-in", None, auth),
        ("post", "/v1/models/{uid}/swap-in", f"/v1/models/{uids['zzz']}/swap-in", None, auth),
        ("post", "/v1/models/{uid}/reload", f"/v1/models/{uids['a']}/reload", None, auth),
        ("post", "/v1/models/{uid}/reload", f"/v1/models/{uids['a']}/reload?hostCopy=drop", None, auth),
        ("post", "/v1/models/{uid}/reload", f"/v1/models/{uids['a']}/reload?hostCopy=both", None, auth),
        ("post", "/v1/models/{uid}/reload", f"/v1/models/{uids['zzz']}/reload", None, auth),
        ("delete", "/v1/models/{uid}", f"/v1/models/{uids['a']}", None, auth),
        ("delete", "/v1/models/{uid}", f"/v1/models/{uids['gone']}", None, auth),
    ]  # fmt: skip
    seen: set[tuple[str, str, int]] = set()
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        for method, template, path, body, headers in calls:
            response = await client.request(method, path, json=body, headers=headers)
            status = response.status
            documented = document["paths"][template][method]["responses"]
            assert str(status) in documented, f"{method} {path} answered an undocumented {status}"
            media = resolve(document, documented[str(status)])["content"]["application/json"]
            schema_validator(document, media["schema"]).validate(await response.json())
            seen.add((method, template, status))
        response = await client.get("/v1/openapi.yaml")
        assert response.status == 200
        assert response.content_type == "application/yaml"
        assert yaml.safe_load(await response.text()) == document
    statuses = {status for _, _, status in seen}
    assert statuses == {200, 400, 401, 403, 404, 409}


def service(tmp_path: Path) -> ControlService:
    settings = ControlSettings(
        node_name="node-1",
        token_file=tmp_path / "token",
        state_file=tmp_path / "revision.json",
        unload_check_interval_seconds=3600,
    )
    backend = InMemoryBackend("node-1", {"gpu-0": 10 * GiB})
    return ControlService(backend, settings, clock=lambda: 0.0)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "case",
    [
        ("Revision", "term", control.MAX_REVISION_NUMBER, "revision.term"),
        ("Revision", "counter", control.MAX_REVISION_NUMBER, "revision.counter"),
        ("DesiredEntry", "generation", control.MAX_GENERATION, "entries[0].generation"),
    ],
)
async def test_the_documented_bounds_are_the_agents(
    document: dict[str, Any], tmp_path: Path, case: tuple[str, str, int, str]
) -> None:
    """Issue 26, item 8: each bound the document states is the one the agent enforces: a
    body at the bound validates and is taken, one past it fails the schema and is a 400
    naming the field."""
    schema, prop, bound, field = case
    assert document["components"]["schemas"][schema]["properties"][prop]["maximum"] == bound
    (tmp_path / "token").write_text("t")
    auth = {"Authorization": "Bearer t"}
    app = make_app(service(tmp_path), TokenFile(tmp_path / "token"))
    spec = {"model": {"source": {"uri": "/m"}, "weightsBytes": "1Gi"}}
    policy = effective_policy(spec, BUILTIN_DEFAULTS).to_status().to_dict()

    def body(value: int) -> dict[str, Any]:
        revision = {"term": 1, "counter": 1}
        item = {"uid": "00000000-0000-4000-8000-00000000000a", "namespace": "ns", "name": "a",
                "generation": 1, "spec": spec, "policy": policy}  # fmt: skip
        if schema == "Revision":
            revision[prop] = value
        else:
            item[prop] = value
        return {"revision": revision, "entries": [item]}

    put = document["paths"]["/v1/desired"]["put"]
    validator = schema_validator(
        document, put["requestBody"]["content"]["application/json"]["schema"]
    )
    validator.validate(body(bound))
    assert not validator.is_valid(body(bound + 1))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        response = await client.put("/v1/desired", json=body(bound + 1), headers=auth)
        answer = await response.json()
        assert (response.status, answer["field"]) == (400, field), answer
        assert "400" in put["responses"]
        response = await client.put("/v1/desired", json=body(bound), headers=auth)
        assert response.status == 200, await response.text()
