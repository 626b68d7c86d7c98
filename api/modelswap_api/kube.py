"""The only module that imports `kubernetes`: API clients shared by the operator and agent.

`api_client` takes explicit configuration (a kubeconfig path, or the in-cluster service
account); nothing here reads the environment at import time. Below it, one generic CRUD
(`Objects`) over a table of kinds (`Kind`), and the helpers callers name (`read_lease`,
...), each one kind's method: one blocking request (`timeout_seconds` bounds it) through the
client's typed methods, plain JSON dicts in and out, errors as `KubeError` / `NotFound` /
`Conflict` (`modelswap_api.errors`); callers on an event loop run them in a thread.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from modelswap_api import crds

# Re-exported: most callers name them as `kube.KubeError`, `kube.NotFound`, `kube.Conflict`.
from modelswap_api.errors import Conflict as Conflict  # noqa: PLC0414
from modelswap_api.errors import KubeConfigError
from modelswap_api.errors import KubeError as KubeError  # noqa: PLC0414
from modelswap_api.errors import NotFound as NotFound  # noqa: PLC0414


def api_client(kubeconfig: str | None = None, *, context: str | None = None) -> client.ApiClient:
    """An ApiClient from `kubeconfig` (path), or the in-cluster config when None;
    KubeConfigError (the client's text) when that cannot be used, OSError when the file
    cannot be read."""
    configuration = client.Configuration()
    try:
        if kubeconfig is None:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
    except ConfigException as e:
        raise KubeConfigError(str(e)) from e
    return client.ApiClient(configuration)


def custom_objects(api: client.ApiClient) -> client.CustomObjectsApi:
    """Access to ModelDeployments and SwapNodes."""
    return client.CustomObjectsApi(api)


DEFAULT_TIMEOUT_SECONDS = 10.0
_TIMEOUT = DEFAULT_TIMEOUT_SECONDS
_JSON_PATCH = "application/json-patch+json"
# Named on every merge patch: client versions differ in the content type they pick for a
# dict body (JSON patch, strategic merge), so say which one is meant.
_MERGE_PATCH = "application/merge-patch+json"
_Api = client.ApiClient
_Json = dict[str, Any]
_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(frozen=True)
class Kind:
    """A kind: how messages name it and which client methods serve it: a custom resource
    (`group` set) `CustomObjectsApi`'s, a built-in one its typed `api`'s, named after
    `snake`."""

    noun: str  # in messages: "create endpointslice team-a/chat"
    plural: str
    namespaced: bool
    api: Callable[[client.ApiClient], Any] = client.CoreV1Api
    snake: str = ""  # the typed API's name for it: "endpoint_slice"
    group: str = ""
    version: str = ""
    replace_verb: str = "replace"  # in messages (a Lease replace is a renewal)


def _error(e: ApiException, what: str) -> KubeError:
    status = int(e.status) if e.status else None
    reason, message = str(e.reason or ""), ""
    with contextlib.suppress(ValueError, TypeError):
        body = json.loads(e.body or "")
        reason = body.get("reason") or reason
        message = body.get("message") or ""
    text = f"{what}: {status} {reason}" + (f": {message}" if message else "")
    if status == 404:
        return NotFound(text, status=status, reason=reason)
    if status == 409:
        return Conflict(text, status=status, reason=reason)
    return KubeError(text, status=status, reason=reason)


def _call(what: str, method: Callable[..., Any], *args: Any, timeout_seconds: float,
          **kwargs: Any) -> _Json:  # fmt: skip
    try:
        response = method(*args, _preload_content=False, _request_timeout=timeout_seconds, **kwargs)
    except ApiException as e:
        raise _error(e, what) from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise KubeError(f"{what}: API server unreachable: {e}") from e
    except ValueError as e:
        # The client checks a body against its models (pydantic) before sending it, and that
        # error quotes the values (a Secret's data): say where, never what, and unchained.
        raise KubeError(f"{what}: the request does not fit the API's schema: {_where(e)}") from None
    try:
        data = json.loads(response.data)
    except (ValueError, TypeError) as e:
        raise KubeError(f"{what}: the answer is not JSON: {e}") from e
    if not isinstance(data, dict):
        raise KubeError(f"{what}: the answer is not an object")
    return data


def _where(e: ValueError) -> str:
    """The fields a client-side validation error names, without their values."""
    errors = getattr(e, "errors", None)
    if not callable(errors):
        return "invalid value"
    try:
        found = errors(include_input=False, include_url=False, include_context=False)
        places = [".".join(str(part) for part in error["loc"]) for error in found]
    except (TypeError, KeyError):
        return "invalid value"
    return ", ".join(places) or "invalid value"


def _done(write: Callable[[], object]) -> bool:
    """True when `write` succeeded, False when its object was gone (cleanup is idempotent)."""
    try:
        write()
    except NotFound:
        return False
    return True


class Objects:
    """The generic CRUD over one `Kind`, each verb one request. `namespace` comes first:
    None for a cluster-scoped kind (whose helpers drop it), or to list a namespaced custom
    resource in every namespace."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind

    def _request(self, api: _Api, verb: str, namespace: str | None, name: str, *body: object,
                 said: str = "", what: str = "", status: bool = False,
                 **options: Any) -> _Json:  # fmt: skip
        """`verb` on the object (its status subresource when `status`); errors say `what`,
        else `said` (else `verb`) and the object. Custom resources' methods are generic
        (`get_namespaced_custom_object(group, version, namespace, plural, name)`), built-in
        kinds' typed (`read_namespaced_service(name, namespace)`)."""
        kind, tail = self.kind, "_status" if status else ""
        names = [name] if verb not in ("create", "list") else []
        spaces = [namespace] if namespace is not None else []
        if kind.group:
            scope = "namespaced" if namespace is not None else "cluster"
            named = "get" if verb == "read" else verb
            method = getattr(client.CustomObjectsApi(api), f"{named}_{scope}_custom_object{tail}")
            args = [kind.group, kind.version, *spaces, kind.plural, *names]
        else:
            scope = "namespaced_" if kind.namespaced else ""
            method = getattr(kind.api(api), f"{verb}_{scope}{kind.snake}{tail}")
            args = names + spaces
        where = f"{namespace}/{name}" if namespace is not None else name
        what = what or f"{said or verb} {kind.noun} {where}" + (" status" if status else "")
        return _call(what, method, *args, *body, **options)

    def get(self, api: _Api, namespace: str | None, name: str, *,
            timeout_seconds: float = _TIMEOUT) -> _Json:  # fmt: skip
        """The object; NotFound when there is none."""
        return self._request(api, "read", namespace, name, said="get",
                             timeout_seconds=timeout_seconds)  # fmt: skip

    def read(self, api: _Api, namespace: str | None, name: str, *,
             timeout_seconds: float = _TIMEOUT) -> _Json | None:  # fmt: skip
        """The object, or None."""
        try:
            return self.get(api, namespace, name, timeout_seconds=timeout_seconds)
        except NotFound:
            return None

    def create(self, api: _Api, namespace: str | None, body: Mapping[str, Any], *,
               timeout_seconds: float = _TIMEOUT) -> _Json:  # fmt: skip
        """Create an object (`body`'s status is ignored where the kind has a status
        subresource); Conflict when it exists. Errors name it (name, else generateName),
        never its data."""
        metadata = body.get("metadata", {})
        name = metadata.get("name") or metadata.get("generateName", "")
        return self._request(api, "create", namespace, name, dict(body),
                             timeout_seconds=timeout_seconds)  # fmt: skip

    def replace(self, api: _Api, namespace: str | None, body: Mapping[str, Any], *,
                timeout_seconds: float = _TIMEOUT) -> _Json:  # fmt: skip
        """Replace an object (PUT); Conflict when `body`'s resourceVersion is stale."""
        name, said = body["metadata"]["name"], self.kind.replace_verb
        return self._request(api, "replace", namespace, name, dict(body), said=said,
                             timeout_seconds=timeout_seconds)  # fmt: skip

    def patch(self, api: _Api, namespace: str | None, name: str, merge_patch: Mapping[str, Any],
              *, timeout_seconds: float = _TIMEOUT, said: str = "") -> _Json:  # fmt: skip
        """A JSON merge patch (not strategic: None removes a key, lists such as `finalizers`
        or `ports` are replaced whole); a status subresource is `patch_status`'s. NotFound
        when the object is gone."""
        return self._request(api, "patch", namespace, name, dict(merge_patch), said=said,
                             _content_type=_MERGE_PATCH,
                             timeout_seconds=timeout_seconds)  # fmt: skip

    def patch_status(self, api: _Api, namespace: str, name: str, merge_patch: Mapping[str, Any],
                     *, timeout_seconds: float = _TIMEOUT) -> _Json:  # fmt: skip
        """`patch` the status subresource: `merge_patch` is shaped `{"status": {...}}`."""
        return self._request(api, "patch", namespace, name, dict(merge_patch), status=True,
                             _content_type=_MERGE_PATCH,
                             timeout_seconds=timeout_seconds)  # fmt: skip

    def replace_status(self, api: _Api, namespace: str | None, name: str,
                       status: Mapping[str, Any], *,
                       timeout_seconds: float = _TIMEOUT) -> _Json:  # fmt: skip
        """Set the whole status (JSON patch `add /status`: keys left out are removed)."""
        body = [{"op": "add", "path": "/status", "value": dict(status)}]
        return self._request(api, "patch", namespace, name, body, said="write", status=True,
                             _content_type=_JSON_PATCH,
                             timeout_seconds=timeout_seconds)  # fmt: skip

    def delete(self, api: _Api, namespace: str | None, name: str, *,
               resource_version: str | None = None,
               timeout_seconds: float = _TIMEOUT) -> bool:  # fmt: skip
        """Delete an object: True when this call deleted it, False when it was gone.
        `resource_version`: only that version (Conflict when it changed meanwhile)."""
        options: dict[str, Any] = {}
        if resource_version:
            preconditions = client.V1Preconditions(resource_version=resource_version)
            options["body"] = client.V1DeleteOptions(preconditions=preconditions)
        return _done(lambda: self._request(api, "delete", namespace, name,
                                           timeout_seconds=timeout_seconds, **options))  # fmt: skip

    def list(self, api: _Api, namespace: str | None, *,
             timeout_seconds: float = _TIMEOUT) -> list[_Json]:  # fmt: skip
        """Every object in `namespace`, or in every namespace when None (one page)."""
        what = f"list {self.kind.plural}"
        what += f" in {namespace or 'every namespace'}" if self.kind.namespaced else ""
        listed = self._request(api, "list", namespace, "", what=what,
                               timeout_seconds=timeout_seconds)  # fmt: skip
        if not isinstance(items := listed.get("items"), list):
            raise KubeError(f"{what}: the answer has no items")
        return [item for item in items if isinstance(item, dict)]

    def scale(self, api: _Api, namespace: str, name: str, replicas: int, *,
              timeout_seconds: float = _TIMEOUT) -> bool:  # fmt: skip
        """Set `spec.replicas`: True when patched, False when there is no such object."""
        patch = {"spec": {"replicas": replicas}}
        return _done(lambda: self.patch(api, namespace, name, patch, said="scale",
                                        timeout_seconds=timeout_seconds))  # fmt: skip


# The table: the node agent's heartbeat (Node, SwapNode, Lease) and the operator's kinds
# (Services and EndpointSlices point at the hosting node's gateway; Secrets hold
# model-source credentials: never log what `read_secret` returns).
NODES = Objects(Kind("node", "nodes", namespaced=False, snake="node"))
NAMESPACES = Objects(Kind("namespace", "namespaces", namespaced=False, snake="namespace"))
SWAPNODES = Objects(Kind("swapnode", "swapnodes", namespaced=False, group=crds.GROUP,
                         version=crds.VERSION))  # fmt: skip
MODEL_DEPLOYMENTS = Objects(Kind("modeldeployment", "modeldeployments", namespaced=True,
                                 group=crds.GROUP, version=crds.VERSION))  # fmt: skip
LEASES = Objects(Kind("lease", "leases", namespaced=True, api=client.CoordinationV1Api,
                      snake="lease", replace_verb="renew"))  # fmt: skip
SERVICES = Objects(Kind("service", "services", namespaced=True, snake="service"))
ENDPOINT_SLICES = Objects(Kind("endpointslice", "endpointslices", namespaced=True,
                               api=client.DiscoveryV1Api, snake="endpoint_slice"))  # fmt: skip
SECRETS = Objects(Kind("secret", "secrets", namespaced=True, snake="secret"))
EVENTS = Objects(Kind("event", "events", namespaced=True, snake="event"))
DEPLOYMENTS = Objects(Kind("deployment", "deployments", namespaced=True, api=client.AppsV1Api,
                           snake="deployment"))  # fmt: skip


def _named(name: str, method: Callable[_P, _R]) -> Callable[_P, _R]:
    """`method` as a function called `name`: callers label metrics with a helper's
    `__name__` (`kube_calls{helper="read_lease"}`), and tests' fakes answer by it."""

    def helper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        return method(*args, **kwargs)

    helper.__name__ = helper.__qualname__ = name
    helper.__doc__ = method.__doc__  # the kind's method's
    return helper


def _cluster(name: str, method: Callable[Concatenate[_Api, None, _P], _R]
             ) -> Callable[Concatenate[_Api, _P], _R]:  # fmt: skip
    """`_named` for a cluster-scoped kind: no `namespace` argument."""

    def helper(api: _Api, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return method(api, None, *args, **kwargs)

    helper.__doc__ = method.__doc__
    return _named(name, helper)


# The helpers callers name: each one kind's method.
read_node = _cluster("read_node", NODES.get)
read_namespace = _cluster("read_namespace", NAMESPACES.read)
read_swapnode = _cluster("read_swapnode", SWAPNODES.read)
create_swapnode = _cluster("create_swapnode", SWAPNODES.create)
patch_swapnode = _cluster("patch_swapnode", SWAPNODES.patch)
delete_swapnode = _cluster("delete_swapnode", SWAPNODES.delete)
replace_swapnode_status = _cluster("replace_swapnode_status", SWAPNODES.replace_status)
list_swapnodes = _cluster("list_swapnodes", SWAPNODES.list)
read_model_deployment = _named("read_model_deployment", MODEL_DEPLOYMENTS.read)
patch_model_deployment = _named("patch_model_deployment", MODEL_DEPLOYMENTS.patch)
patch_model_deployment_status = _named("patch_model_deployment_status",
                                       MODEL_DEPLOYMENTS.patch_status)  # fmt: skip
list_model_deployments = _named("list_model_deployments", MODEL_DEPLOYMENTS.list)
read_lease = _named("read_lease", LEASES.read)
create_lease = _named("create_lease", LEASES.create)
replace_lease = _named("replace_lease", LEASES.replace)
list_leases = _named("list_leases", LEASES.list)
read_service = _named("read_service", SERVICES.read)
create_service = _named("create_service", SERVICES.create)
patch_service = _named("patch_service", SERVICES.patch)
delete_service = _named("delete_service", SERVICES.delete)
read_endpoint_slice = _named("read_endpoint_slice", ENDPOINT_SLICES.read)
create_endpoint_slice = _named("create_endpoint_slice", ENDPOINT_SLICES.create)
replace_endpoint_slice = _named("replace_endpoint_slice", ENDPOINT_SLICES.replace)
delete_endpoint_slice = _named("delete_endpoint_slice", ENDPOINT_SLICES.delete)
read_secret = _named("read_secret", SECRETS.read)
create_secret = _named("create_secret", SECRETS.create)
create_event = _named("create_event", EVENTS.create)
patch_event = _named("patch_event", EVENTS.patch)
scale_deployment = _named("scale_deployment", DEPLOYMENTS.scale)
