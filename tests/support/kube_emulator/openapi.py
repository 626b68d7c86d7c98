"""OpenAPI documents for the served resources: `/openapi/v2` (JSON) and `/openapi/v3`.

kubectl reads v3 to learn, per group/version, which PATCH content types a kind takes and
whether its PATCH takes `fieldValidation` (then it leaves validation to the server, which
refuses unknown fields under Strict); `kubectl explain` reads the schemas. Custom resources
carry their CRD's openAPIV3Schema; built-in types a loose object schema.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from tests.support.kube_emulator import patching
from tests.support.kube_emulator.resources import ResourceType

OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_OBJECT_META_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "ObjectMeta is metadata that all persisted resources must have.",
    "properties": {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "generation": {"type": "integer", "format": "int64"},
        "creationTimestamp": {"type": "string", "format": "date-time"},
        "deletionTimestamp": {"type": "string", "format": "date-time"},
        "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {
            "type": "array",
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
        "managedFields": {
            "type": "array",
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
        "selfLink": {"type": "string"},
    },
}
_QUERY_PARAMS = ("dryRun", "fieldManager", "fieldValidation", "pretty")


def schema_name(rt: ResourceType) -> str:
    """`io.modelswap.v1alpha1.ModelDeployment`, `io.k8s.api.core.v1.Namespace`."""
    if rt.group == "":
        prefix = "io.k8s.api.core"
    elif rt.group.endswith(".k8s.io"):
        prefix = "io.k8s.api." + rt.group.removesuffix(".k8s.io")
    else:
        prefix = ".".join(reversed(rt.group.split(".")))
    return f"{prefix}.{rt.version}.{rt.kind}"


def _gvk(rt: ResourceType) -> dict[str, str]:
    return {"group": rt.group, "version": rt.version, "kind": rt.kind}


def _object_schema(rt: ResourceType, ref_prefix: str) -> dict[str, Any]:
    if rt.schema is not None:
        schema = copy.deepcopy(rt.schema)
    else:
        schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    props = schema.setdefault("properties", {})
    props["apiVersion"] = {"type": "string", "description": "APIVersion of the object."}
    props["kind"] = {"type": "string", "description": "Kind of the object."}
    props["metadata"] = {"$ref": f"{ref_prefix}{OBJECT_META}"}
    schema["x-kubernetes-group-version-kind"] = [_gvk(rt)]
    return schema


def _patch_types(rt: ResourceType) -> list[str]:
    """The PATCH content types advertised. The server takes strategic merge on built-ins, but
    the loose built-in schemas here cannot drive kubectl's patch computation, so it is not
    advertised: kubectl then computes it from its compiled-in types, as for older servers."""
    del rt
    return [patching.JSON_PATCH, patching.MERGE_PATCH, patching.APPLY_PATCH]


def _base_path(rt: ResourceType, namespaced_path: bool) -> str:
    root = f"/apis/{rt.group}/{rt.version}" if rt.group else "/api/v1"
    return (
        f"{root}/namespaces/{{namespace}}/{rt.plural}" if namespaced_path else f"{root}/{rt.plural}"
    )


def _param(name: str, where: str = "query") -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "schema": {"type": "string", "uniqueItems": True},
    }


def _paths_v3(rt: ResourceType) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{schema_name(rt)}"}
    json_ref = {"application/json": {"schema": ref}}
    ext = {"x-kubernetes-group-version-kind": _gvk(rt)}
    query = [_param(p) for p in _QUERY_PARAMS]
    item_params = [_param("name", "path")]
    if rt.namespaced:
        item_params.append(_param("namespace", "path"))
    base = _base_path(rt, rt.namespaced)
    ok = {"200": {"description": "OK", "content": json_ref}}

    def op(action: str, **extra: Any) -> dict[str, Any]:
        return {
            "operationId": f"{action}{rt.kind}",
            "x-kubernetes-action": action,
            "parameters": query,
            "responses": ok,
            **ext,
            **extra,
        }

    patch_body = {"content": {t: {"schema": {"type": "object"}} for t in _patch_types(rt)}}
    item = {
        "get": op("get"),
        "put": op("put", requestBody={"content": json_ref}),
        "patch": op("patch", requestBody=patch_body),
        "delete": op("delete"),
        "parameters": item_params + query,
    }
    collection = {
        "get": op("list"),
        "post": op("post", requestBody={"content": json_ref}),
        "parameters": ([_param("namespace", "path")] if rt.namespaced else []) + query,
    }
    paths = {base: collection, f"{base}/{{name}}": item}
    if "status" in rt.subresources:
        paths[f"{base}/{{name}}/status"] = {
            "get": op("get"),
            "put": op("put", requestBody={"content": json_ref}),
            "patch": op("patch", requestBody=patch_body),
            "parameters": item_params + query,
        }
    return paths


def v3_document(types: list[ResourceType], version: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {OBJECT_META: _OBJECT_META_SCHEMA}
    for rt in types:
        paths.update(_paths_v3(rt))
        schemas[schema_name(rt)] = _object_schema(rt, "#/components/schemas/")
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def v3_root(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`{"paths": {"apis/g/v": {"serverRelativeURL": "/openapi/v3/apis/g/v?hash=…"}}}`."""
    return {
        "paths": {
            gv_path: {"serverRelativeURL": f"/openapi/v3/{gv_path}?hash={content_hash(doc)}"}
            for gv_path, doc in documents.items()
        }
    }


def content_hash(doc: dict[str, Any]) -> str:
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:128].upper()


def _to_v2_schema(schema: Any) -> Any:
    """Rewrite v3 component refs to v2 definition refs."""
    if isinstance(schema, dict):
        out = {k: _to_v2_schema(v) for k, v in schema.items()}
        if isinstance(out.get("$ref"), str):
            out["$ref"] = out["$ref"].replace("#/components/schemas/", "#/definitions/")
        return out
    if isinstance(schema, list):
        return [_to_v2_schema(v) for v in schema]
    return schema


def v2_document(types: list[ResourceType], version: str) -> dict[str, Any]:
    definitions: dict[str, Any] = {OBJECT_META: _OBJECT_META_SCHEMA}
    paths: dict[str, Any] = {}
    for rt in types:
        definitions[schema_name(rt)] = _to_v2_schema(_object_schema(rt, "#/definitions/"))
        ref = {"$ref": f"#/definitions/{schema_name(rt)}"}
        ext = {"x-kubernetes-group-version-kind": _gvk(rt)}
        base = _base_path(rt, rt.namespaced)
        ok = {"200": {"description": "OK", "schema": ref}}
        paths[f"{base}/{{name}}"] = {
            "get": {"responses": ok, "produces": ["application/json"], **ext},
            "patch": {"responses": ok, "consumes": _patch_types(rt), **ext},
        }
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": version},
        "paths": paths,
        "definitions": definitions,
    }
