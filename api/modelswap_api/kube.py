"""The only module that imports `kubernetes`: API clients shared by the operator and agent.

Configuration is explicit — a kubeconfig path, or the in-cluster service account — and the
returned `ApiClient` is passed down; nothing here reads the environment at import time.

Below them, thin typed helpers for the node agent's heartbeat (Node, SwapNode, Lease) and
for the operator (ModelDeployments, SwapNodes, Services, EndpointSlices, Secrets, Leases,
Events): one blocking request each, plain JSON dicts in and out, errors as `KubeError` /
`NotFound` / `Conflict` (so no other module needs the client's exception types). Callers on
an event loop run them in a thread (the operator from a bounded pool).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from modelswap_api import crds


def api_client(kubeconfig: str | None = None, *, context: str | None = None) -> client.ApiClient:
    """An ApiClient from `kubeconfig` (path), or the in-cluster config when None."""
    configuration = client.Configuration()
    if kubeconfig is None:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    return client.ApiClient(configuration)


def custom_objects(api: client.ApiClient) -> client.CustomObjectsApi:
    """Access to ModelDeployments and SwapNodes."""
    return client.CustomObjectsApi(api)


# Typed helpers for the node agent and the operator. Each is one blocking call that
# answers plain JSON dicts (no client model classes) and raises `KubeError` (never the
# client's exceptions, which no other module may import); callers on an event loop run
# them in a thread. `timeout_seconds` bounds each request.

SWAPNODE_GROUP = crds.GROUP
SWAPNODE_VERSION = crds.VERSION
SWAPNODE_PLURAL = "swapnodes"
MODEL_DEPLOYMENT_PLURAL = "modeldeployments"
DEFAULT_TIMEOUT_SECONDS = 10.0
_JSON_PATCH = "application/json-patch+json"
# Named on every merge patch: client versions differ in the content type they pick for a
# dict body (JSON patch, strategic merge), so say which one is meant.
_MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """A Kubernetes API call failed.

    KubeError       `status` is the HTTP status, None when the server was unreachable
    ├── NotFound    404
    └── Conflict    409: the object exists already, or a write carried a stale resourceVersion
    """

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class NotFound(KubeError):  # noqa: N818 - named after the API's reason
    pass


class Conflict(KubeError):  # noqa: N818
    pass


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
          **kwargs: Any) -> dict[str, Any]:  # fmt: skip
    try:
        response = method(*args, _preload_content=False, _request_timeout=timeout_seconds, **kwargs)
    except ApiException as e:
        raise _error(e, what) from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise KubeError(f"{what}: API server unreachable: {e}") from e
    except ValueError as e:
        # Newer clients check a body against their models (pydantic) before sending it, and
        # that error quotes the offending values: a Secret's data among them. Say where
        # the body is wrong, never what it holds, and drop the chained error for the same
        # reason.
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


def _items(listed: dict[str, Any], what: str) -> list[dict[str, Any]]:
    items = listed.get("items")
    if not isinstance(items, list):
        raise KubeError(f"{what}: the answer has no items")
    return [item for item in items if isinstance(item, dict)]


def _or_none(read: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    try:
        return read()
    except NotFound:
        return None


def read_node(
    api: client.ApiClient, name: str, *, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
) -> dict[str, Any]:
    """The Node `name`; NotFound when there is none."""
    core = client.CoreV1Api(api)
    return _call(f"get node {name}", core.read_node, name, timeout_seconds=timeout_seconds)


def read_swapnode(
    api: client.ApiClient, name: str, *, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
) -> dict[str, Any] | None:
    """The SwapNode `name`, or None."""
    custom = custom_objects(api)
    return _or_none(
        lambda: _call(
            f"get swapnode {name}",
            custom.get_cluster_custom_object,
            SWAPNODE_GROUP,
            SWAPNODE_VERSION,
            SWAPNODE_PLURAL,
            name,
            timeout_seconds=timeout_seconds,
        )
    )


def create_swapnode(
    api: client.ApiClient,
    body: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Create a SwapNode (its status is ignored: write it with `replace_swapnode_status`)."""
    name = body.get("metadata", {}).get("name", "")
    return _call(
        f"create swapnode {name}",
        custom_objects(api).create_cluster_custom_object,
        SWAPNODE_GROUP,
        SWAPNODE_VERSION,
        SWAPNODE_PLURAL,
        dict(body),
        timeout_seconds=timeout_seconds,
    )


def patch_swapnode(
    api: client.ApiClient,
    name: str,
    merge_patch: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Merge-patch a SwapNode's metadata or spec (e.g. its ownerReferences)."""
    return _call(
        f"patch swapnode {name}",
        custom_objects(api).patch_cluster_custom_object,
        SWAPNODE_GROUP,
        SWAPNODE_VERSION,
        SWAPNODE_PLURAL,
        name,
        dict(merge_patch),
        timeout_seconds=timeout_seconds,
    )


def delete_swapnode(
    api: client.ApiClient,
    name: str,
    *,
    resource_version: str | None = None,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> bool:
    """Delete a SwapNode: True when this call deleted it, False when it was gone.
    `resource_version`: only that version (Conflict when it changed meanwhile)."""
    options = (
        client.V1DeleteOptions(
            preconditions=client.V1Preconditions(resource_version=resource_version)
        )
        if resource_version
        else None
    )
    try:
        _call(
            f"delete swapnode {name}",
            custom_objects(api).delete_cluster_custom_object,
            SWAPNODE_GROUP,
            SWAPNODE_VERSION,
            SWAPNODE_PLURAL,
            name,
            body=options,
            timeout_seconds=timeout_seconds,
        )
    except NotFound:
        return False
    return True


def replace_swapnode_status(
    api: client.ApiClient,
    name: str,
    status: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Set a SwapNode's whole status (a JSON patch `add /status`: keys left out are removed,
    which a merge patch would keep)."""
    return _call(
        f"write swapnode {name} status",
        custom_objects(api).patch_cluster_custom_object_status,
        SWAPNODE_GROUP,
        SWAPNODE_VERSION,
        SWAPNODE_PLURAL,
        name,
        [{"op": "add", "path": "/status", "value": dict(status)}],
        _content_type=_JSON_PATCH,
        timeout_seconds=timeout_seconds,
    )


def read_lease(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any] | None:
    """The Lease `namespace/name`, or None."""
    leases = client.CoordinationV1Api(api)
    return _or_none(
        lambda: _call(
            f"get lease {namespace}/{name}",
            leases.read_namespaced_lease,
            name,
            namespace,
            timeout_seconds=timeout_seconds,
        )
    )


def create_lease(
    api: client.ApiClient,
    namespace: str,
    body: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Create a Lease; Conflict when it exists already."""
    name = body.get("metadata", {}).get("name", "")
    return _call(
        f"create lease {namespace}/{name}",
        client.CoordinationV1Api(api).create_namespaced_lease,
        namespace,
        dict(body),
        timeout_seconds=timeout_seconds,
    )


def replace_lease(
    api: client.ApiClient,
    namespace: str,
    body: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Replace a Lease (PUT); Conflict when `body`'s resourceVersion is stale."""
    name = body["metadata"]["name"]
    return _call(
        f"renew lease {namespace}/{name}",
        client.CoordinationV1Api(api).replace_namespaced_lease,
        name,
        namespace,
        dict(body),
        timeout_seconds=timeout_seconds,
    )


def list_leases(
    api: client.ApiClient,
    namespace: str,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> list[dict[str, Any]]:
    """Every Lease in `namespace` (the node Leases: one read to judge every node's heartbeat)."""
    what = f"list leases in {namespace}"
    listed = _call(
        what,
        client.CoordinationV1Api(api).list_namespaced_lease,
        namespace,
        timeout_seconds=timeout_seconds,
    )
    return _items(listed, what)


# ModelDeployments (namespaced) and SwapNodes (cluster-scoped), for the operator.


def read_model_deployment(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any] | None:
    """The ModelDeployment `namespace/name`, or None."""
    custom = custom_objects(api)
    return _or_none(
        lambda: _call(
            f"get modeldeployment {namespace}/{name}",
            custom.get_namespaced_custom_object,
            crds.GROUP,
            crds.VERSION,
            namespace,
            MODEL_DEPLOYMENT_PLURAL,
            name,
            timeout_seconds=timeout_seconds,
        )
    )


def patch_model_deployment(
    api: client.ApiClient,
    namespace: str,
    name: str,
    merge_patch: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Merge-patch a ModelDeployment's metadata (finalizers, annotations); the status is
    not written here (the main resource ignores it): use `patch_model_deployment_status`.
    A merge patch replaces lists whole, so send the complete `finalizers`; NotFound when
    the object is gone."""
    return _call(
        f"patch modeldeployment {namespace}/{name}",
        custom_objects(api).patch_namespaced_custom_object,
        crds.GROUP,
        crds.VERSION,
        namespace,
        MODEL_DEPLOYMENT_PLURAL,
        name,
        dict(merge_patch),
        _content_type=_MERGE_PATCH,
        timeout_seconds=timeout_seconds,
    )


def patch_model_deployment_status(
    api: client.ApiClient,
    namespace: str,
    name: str,
    merge_patch: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Merge-patch a ModelDeployment's status subresource: `merge_patch` is the whole
    object's shape (`{"status": {...}}`); keys set to None are removed, keys left out
    are kept, lists (conditions) are replaced whole."""
    return _call(
        f"patch modeldeployment {namespace}/{name} status",
        custom_objects(api).patch_namespaced_custom_object_status,
        crds.GROUP,
        crds.VERSION,
        namespace,
        MODEL_DEPLOYMENT_PLURAL,
        name,
        dict(merge_patch),
        _content_type=_MERGE_PATCH,
        timeout_seconds=timeout_seconds,
    )


def list_swapnodes(
    api: client.ApiClient, *, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
) -> list[dict[str, Any]]:
    """Every SwapNode (one page: a cluster has one per GPU node)."""
    what = "list swapnodes"
    listed = _call(
        what,
        custom_objects(api).list_cluster_custom_object,
        SWAPNODE_GROUP,
        SWAPNODE_VERSION,
        SWAPNODE_PLURAL,
        timeout_seconds=timeout_seconds,
    )
    return _items(listed, what)


# Services and EndpointSlices: one of each per ModelDeployment, pointing at the hosting
# node's gateway.


def read_service(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any] | None:
    """The Service `namespace/name`, or None."""
    core = client.CoreV1Api(api)
    return _or_none(
        lambda: _call(
            f"get service {namespace}/{name}",
            core.read_namespaced_service,
            name,
            namespace,
            timeout_seconds=timeout_seconds,
        )
    )


def create_service(
    api: client.ApiClient,
    namespace: str,
    body: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Create a Service; Conflict when it exists already."""
    name = body.get("metadata", {}).get("name", "")
    return _call(
        f"create service {namespace}/{name}",
        client.CoreV1Api(api).create_namespaced_service,
        namespace,
        dict(body),
        timeout_seconds=timeout_seconds,
    )


def patch_service(
    api: client.ApiClient,
    namespace: str,
    name: str,
    merge_patch: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Merge-patch a Service (a JSON merge patch, not a strategic one: `ports` is replaced
    whole, so send every port); NotFound when it is gone."""
    return _call(
        f"patch service {namespace}/{name}",
        client.CoreV1Api(api).patch_namespaced_service,
        name,
        namespace,
        dict(merge_patch),
        _content_type=_MERGE_PATCH,
        timeout_seconds=timeout_seconds,
    )


def delete_service(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> bool:
    """Delete a Service: True when this call deleted it, False when it was gone already
    (cleanup is idempotent, so a missing Service is no error)."""
    try:
        _call(
            f"delete service {namespace}/{name}",
            client.CoreV1Api(api).delete_namespaced_service,
            name,
            namespace,
            timeout_seconds=timeout_seconds,
        )
    except NotFound:
        return False
    return True


def read_endpoint_slice(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any] | None:
    """The EndpointSlice (discovery.k8s.io/v1) `namespace/name`, or None."""
    discovery = client.DiscoveryV1Api(api)
    return _or_none(
        lambda: _call(
            f"get endpointslice {namespace}/{name}",
            discovery.read_namespaced_endpoint_slice,
            name,
            namespace,
            timeout_seconds=timeout_seconds,
        )
    )


def create_endpoint_slice(
    api: client.ApiClient,
    namespace: str,
    body: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Create an EndpointSlice; Conflict when it exists already."""
    name = body.get("metadata", {}).get("name", "")
    return _call(
        f"create endpointslice {namespace}/{name}",
        client.DiscoveryV1Api(api).create_namespaced_endpoint_slice,
        namespace,
        dict(body),
        timeout_seconds=timeout_seconds,
    )


def replace_endpoint_slice(
    api: client.ApiClient,
    namespace: str,
    body: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Replace an EndpointSlice (PUT: its endpoints and ports are lists a merge patch could
    only replace whole anyway); Conflict when `body`'s resourceVersion is stale."""
    name = body["metadata"]["name"]
    return _call(
        f"replace endpointslice {namespace}/{name}",
        client.DiscoveryV1Api(api).replace_namespaced_endpoint_slice,
        name,
        namespace,
        dict(body),
        timeout_seconds=timeout_seconds,
    )


def delete_endpoint_slice(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> bool:
    """Delete an EndpointSlice: True when this call deleted it, False when it was gone."""
    try:
        _call(
            f"delete endpointslice {namespace}/{name}",
            client.DiscoveryV1Api(api).delete_namespaced_endpoint_slice,
            name,
            namespace,
            timeout_seconds=timeout_seconds,
        )
    except NotFound:
        return False
    return True


# Secrets (model-source credentials), Events and Namespaces.


def read_secret(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any] | None:
    """The Secret `namespace/name` (values base64-encoded under `data`), or None. Never log
    what this returns."""
    core = client.CoreV1Api(api)
    return _or_none(
        lambda: _call(
            f"get secret {namespace}/{name}",
            core.read_namespaced_secret,
            name,
            namespace,
            timeout_seconds=timeout_seconds,
        )
    )


def create_secret(
    api: client.ApiClient,
    namespace: str,
    body: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Create a Secret; Conflict when it exists already. Errors name the Secret, never its
    data."""
    name = body.get("metadata", {}).get("name", "")
    return _call(
        f"create secret {namespace}/{name}",
        client.CoreV1Api(api).create_namespaced_secret,
        namespace,
        dict(body),
        timeout_seconds=timeout_seconds,
    )


def create_event(
    api: client.ApiClient,
    namespace: str,
    body: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Create a core v1 Event (`involvedObject`, `reason`, `message`, `type`, ...) in the
    involved object's namespace; give it a unique `metadata.name` or a `generateName`."""
    metadata = body.get("metadata", {})
    name = metadata.get("name") or metadata.get("generateName", "")
    return _call(
        f"create event {namespace}/{name}",
        client.CoreV1Api(api).create_namespaced_event,
        namespace,
        dict(body),
        timeout_seconds=timeout_seconds,
    )


def patch_event(
    api: client.ApiClient,
    namespace: str,
    name: str,
    merge_patch: Mapping[str, Any],
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Merge-patch a core v1 Event (an Event series' `count` and `lastTimestamp`, as
    client-go's recorder does); NotFound once the API server expired it (its event TTL)."""
    return _call(
        f"patch event {namespace}/{name}",
        client.CoreV1Api(api).patch_namespaced_event,
        name,
        namespace,
        dict(merge_patch),
        _content_type=_MERGE_PATCH,
        timeout_seconds=timeout_seconds,
    )


def read_namespace(
    api: client.ApiClient, name: str, *, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
) -> dict[str, Any] | None:
    """The Namespace `name`, or None (e.g. to tell a missing namespace from a missing
    object, or to see that a namespace is terminating)."""
    core = client.CoreV1Api(api)
    return _or_none(
        lambda: _call(
            f"get namespace {name}", core.read_namespace, name, timeout_seconds=timeout_seconds
        )
    )


def list_model_deployments(
    api: client.ApiClient,
    namespace: str | None,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> list[dict[str, Any]]:
    """Every ModelDeployment in `namespace`, or in every namespace when None (one page: the
    operator's start-up listing, after which its watch keeps it current)."""
    custom = custom_objects(api)
    what = f"list modeldeployments in {namespace or 'every namespace'}"
    if namespace is None:
        listed = _call(what, custom.list_cluster_custom_object, crds.GROUP, crds.VERSION,
                       MODEL_DEPLOYMENT_PLURAL, timeout_seconds=timeout_seconds)  # fmt: skip
    else:
        listed = _call(what, custom.list_namespaced_custom_object, crds.GROUP, crds.VERSION,
                       namespace, MODEL_DEPLOYMENT_PLURAL,
                       timeout_seconds=timeout_seconds)  # fmt: skip
    return _items(listed, what)


def scale_deployment(
    api: client.ApiClient,
    namespace: str,
    name: str,
    replicas: int,
    *,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
) -> bool:
    """Set a Deployment's `spec.replicas` (a merge patch): True when it was patched, False
    when there is no such Deployment."""
    try:
        _call(
            f"scale deployment {namespace}/{name}",
            client.AppsV1Api(api).patch_namespaced_deployment,
            name,
            namespace,
            {"spec": {"replicas": replicas}},
            _content_type=_MERGE_PATCH,
            timeout_seconds=timeout_seconds,
        )
    except NotFound:
        return False
    return True
