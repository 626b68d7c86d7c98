"""The only module that imports `kubernetes`: API clients shared by the operator and agent.

Configuration is explicit — a kubeconfig path, or the in-cluster service account — and the
returned `ApiClient` is passed down; nothing here reads the environment at import time.

Below them, thin typed helpers for the node agent's heartbeat (Node, SwapNode, Lease): one
blocking request each, plain JSON dicts in and out, errors as `KubeError` / `NotFound` /
`Conflict` (so no other module needs the client's exception types).
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


# Typed helpers for the node agent (SwapNode, Node, Lease). Each is one blocking call that
# answers plain JSON dicts (no client model classes) and raises `KubeError` (never the
# client's exceptions, which no other module may import); callers on an event loop run
# them in a thread. `timeout_seconds` bounds each request.

SWAPNODE_GROUP = crds.GROUP
SWAPNODE_VERSION = crds.VERSION
SWAPNODE_PLURAL = "swapnodes"
DEFAULT_TIMEOUT_SECONDS = 10.0
_JSON_PATCH = "application/json-patch+json"


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
    try:
        data = json.loads(response.data)
    except (ValueError, TypeError) as e:
        raise KubeError(f"{what}: the answer is not JSON: {e}") from e
    if not isinstance(data, dict):
        raise KubeError(f"{what}: the answer is not an object")
    return data


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
