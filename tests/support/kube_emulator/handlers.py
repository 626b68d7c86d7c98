"""HTTP handlers: non-resource endpoints (discovery, openapi, version, health) and the verbs
on resource paths, translated to `Cluster` operations."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from modelswap_api import yaml_input
from tests.support.kube_emulator import discovery, listing, openapi, protobuf, tables, watching
from tests.support.kube_emulator.admission import parse_field_validation
from tests.support.kube_emulator.errors import ApiError, bad_request, method_not_allowed
from tests.support.kube_emulator.operations import Cluster, Written
from tests.support.kube_emulator.resources import ResourceType
from tests.support.kube_emulator.routing import ResourcePath, parse_resource_path
from tests.support.kube_emulator.selectors import field_selector, label_selector

_EVENT_FIELDS = frozenset(
    {
        "involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
        "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
        "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type",
    }
)  # fmt: skip
_JSON_TYPES = ("application/json", "application/yaml", "")


def json_response(
    body: Any,
    status: int = 200,
    warnings: list[str] | None = None,
    content_type: str = "application/json",
) -> web.Response:
    headers: CIMultiDict[str] = CIMultiDict({"Content-Type": content_type})
    for warning in warnings or ():
        escaped = warning.replace("\\", "\\\\").replace('"', '\\"')
        headers.add("Warning", f'299 - "{escaped}"')
    return web.Response(body=json.dumps(body).encode(), status=status, headers=headers)


def error_response(error: ApiError) -> web.Response:
    return json_response(error.status(), error.code)


class Handlers:
    def __init__(self, cluster: Cluster, *, bookmark_interval_s: float = 1.0) -> None:
        self.cluster = cluster
        self.bookmark_interval_s = bookmark_interval_s

    # -- non-resource endpoints ------------------------------------------------------------

    def non_resource(self, request: web.Request) -> web.Response | None:
        parts = [p for p in request.path.split("/") if p]
        types = self.cluster.types
        accept = request.headers.get("Accept", "")
        body: Any = None
        if parts in (["healthz"], ["readyz"], ["livez"]):
            return web.Response(text="ok")
        if parts == ["version"]:
            body = discovery.version()
        elif parts in (["api"], ["apis"]) and discovery.wants_aggregated(accept):
            aggregated = discovery.aggregated(types, core=parts == ["api"])
            return json_response(aggregated, content_type=discovery.AGGREGATED_MEDIA_TYPE)
        elif parts == ["api"]:
            body = discovery.core_versions(request.host)
        elif parts == ["api", "v1"]:
            body = discovery.resource_list(types, "", "v1")
        elif parts == ["apis"]:
            body = discovery.group_list(types)
        elif len(parts) == 2 and parts[0] == "apis":
            body = discovery.group(types, parts[1])
        elif len(parts) == 3 and parts[0] == "apis":
            body = discovery.resource_list(types, parts[1], parts[2])
        elif parts == ["openapi", "v2"]:
            if "protobuf" in request.headers.get(
                "Accept", ""
            ) and "json" not in request.headers.get("Accept", ""):
                raise ApiError(406, "only application/json is served", reason="NotAcceptable")
            body = openapi.v2_document(list(types), discovery.version()["gitVersion"])
        elif parts == ["openapi", "v3"]:
            body = openapi.v3_root(self._v3_documents())
        elif len(parts) >= 3 and parts[:2] == ["openapi", "v3"]:
            body = self._v3_documents().get("/".join(parts[2:]))
        elif parts == []:
            body = {"paths": ["/api", "/api/v1", "/apis", "/openapi/v2", "/openapi/v3", "/version"]}
        else:
            return None
        if body is None:
            raise ApiError(404, "the server could not find the requested resource")
        return json_response(body)

    def _v3_documents(self) -> dict[str, dict[str, Any]]:
        by_gv: dict[str, list[ResourceType]] = {}
        for rt in self.cluster.types:
            gv_path = f"apis/{rt.group}/{rt.version}" if rt.group else "api/v1"
            by_gv.setdefault(gv_path, []).append(rt)
        version = discovery.version()["gitVersion"]
        return {gv: openapi.v3_document(rts, version) for gv, rts in sorted(by_gv.items())}

    # -- resources ---------------------------------------------------------------------------

    async def resource(self, request: web.Request) -> web.StreamResponse | None:
        path = parse_resource_path(request.path)
        if path is None:
            return None
        rt = self.cluster.types.get(path.group, path.version, path.plural)
        if rt is None:
            raise ApiError(404, "the server could not find the requested resource")
        if path.namespace is not None and not rt.namespaced:
            raise ApiError(404, "the server could not find the requested resource")
        if path.subresource is not None and path.subresource not in rt.subresources:
            raise ApiError(404, "the server could not find the requested resource")
        if path.name is None:
            return await self._collection(request, rt, path)
        return await self._item(request, rt, path)

    def _predicate(self, request: web.Request, rt: ResourceType) -> Any:
        supported = {"metadata.name", "metadata.namespace", *rt.selectable_fields}
        if rt.key == ("", "events"):
            supported |= _EVENT_FIELDS
        labels = label_selector(request.query.get("labelSelector"))
        fields = field_selector(request.query.get("fieldSelector"), frozenset(supported))
        return lambda obj: labels(obj) and fields(obj)

    async def _collection(
        self, request: web.Request, rt: ResourceType, path: ResourcePath
    ) -> web.StreamResponse:
        if rt.namespaced and path.namespace is None and request.method not in ("GET",):
            raise ApiError(404, "the server could not find the requested resource")
        query = request.query
        if request.method == "GET":
            predicate = self._predicate(request, rt)
            if query.get("watch") in ("true", "1"):
                return await watching.stream(
                    request, self.cluster, rt, path.namespace, predicate,
                    bookmark_interval_s=self.bookmark_interval_s,
                    as_table=tables.accepts_table(request.headers.get("Accept", "")),
                )  # fmt: skip
            return self._list(request, rt, path, predicate)
        if request.method == "POST":
            body = await _read_body(request)
            written = self.cluster.create(
                rt, path.namespace, body, dry_run=_dry_run(request),
                field_validation=parse_field_validation(query.get("fieldValidation")),
            )  # fmt: skip
            return _written(written)
        if request.method == "DELETE":
            predicate = self._predicate(request, rt)
            deleted = []
            for obj in self.cluster.select(rt, path.namespace, predicate):
                meta = obj["metadata"]
                deleted.append(
                    self.cluster.delete(
                        rt, meta.get("namespace"), meta["name"], dry_run=_dry_run(request)
                    ).object
                )
            rv = str(self.cluster.store.rv)
            return json_response(listing.list_body(rt, deleted, rv, None, None))
        raise method_not_allowed(f"{request.method} on a collection")

    def _list(
        self, request: web.Request, rt: ResourceType, path: ResourcePath, predicate: Any
    ) -> web.Response:
        rv = str(self.cluster.store.rv)
        items = self.cluster.select_view(rt, path.namespace, predicate)  # serialised below
        items, token, remaining = listing.page(
            items, rv, request.query.get("limit"), request.query.get("continue")
        )
        if tables.accepts_table(request.headers.get("Accept", "")):
            return json_response(
                tables.table(
                    rt,
                    items,
                    resource_version=rv,
                    continue_token=token,
                    include_object=request.query.get("includeObject", "Metadata"),
                )
            )
        return json_response(listing.list_body(rt, items, rv, token, remaining))

    async def _item(
        self, request: web.Request, rt: ResourceType, path: ResourcePath
    ) -> web.StreamResponse:
        assert path.name is not None
        query = request.query
        validation = parse_field_validation(query.get("fieldValidation"))
        if request.method == "GET":
            obj = self.cluster.get(rt, path.namespace, path.name)
            if tables.accepts_table(request.headers.get("Accept", "")):
                return json_response(
                    tables.table(
                        rt,
                        [obj],
                        resource_version=obj["metadata"]["resourceVersion"],
                        include_object=query.get("includeObject", "Metadata"),
                    )
                )
            return json_response(obj)
        if request.method == "PUT":
            written = self.cluster.replace(
                rt, path.namespace, path.name, await _read_body(request),
                subresource=path.subresource, dry_run=_dry_run(request),
                field_validation=validation,
            )  # fmt: skip
            return _written(written)
        if request.method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            written = self.cluster.patch(
                rt, path.namespace, path.name, content_type, await request.read(),
                subresource=path.subresource, dry_run=_dry_run(request),
                field_validation=validation, field_manager=query.get("fieldManager"),
            )  # fmt: skip
            return _written(written)
        if request.method == "DELETE":
            raw = await request.read()
            options = _decode(raw, request.headers.get("Content-Type", "")) if raw else None
            written = self.cluster.delete(
                rt, path.namespace, path.name, options, dry_run=_dry_run(request)
            )
            if rt.custom or written.object["metadata"].get("deletionTimestamp"):
                return _written(written)
            meta = written.object["metadata"]
            return json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": {"name": meta["name"], "kind": rt.plural, "uid": meta["uid"]},
                }
            )
        raise method_not_allowed(f"{request.method} on an object")


def _written(written: Written) -> web.Response:
    return json_response(written.object, written.code, written.warnings)


def _dry_run(request: web.Request) -> bool:
    values = request.query.getall("dryRun", [])
    for value in values:
        if value != "All":
            raise bad_request(f'unsupported dry run option "{value}"')
    return bool(values)


def _decode(raw: bytes, content_type: str) -> Any:
    kind = content_type.split(";", maxsplit=1)[0].strip()
    if kind == protobuf.MEDIA_TYPE:
        return protobuf.decode(raw)
    if kind not in _JSON_TYPES:
        raise ApiError(
            415,
            f"the body of the request was in an unknown format - accepted media types include: "
            f'application/json, application/yaml (got "{kind}")',
            reason="UnsupportedMediaType",
        )
    try:
        if kind == "application/yaml":  # bounded as every reader of our YAML is
            documents = yaml_input.load_text(raw.decode("utf-8"))
            return documents[0] if documents else None
        return json.loads(raw)
    except ValueError as e:
        raise bad_request(f"error decoding request body: {e}") from e


async def _read_body(request: web.Request) -> Any:
    return _decode(await request.read(), request.headers.get("Content-Type", "application/json"))
