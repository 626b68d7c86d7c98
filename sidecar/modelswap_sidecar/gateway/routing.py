"""Which model a request means: pure functions from (path prefix, Host, name) to a route.

A model is named by the name users call it and its namespace. The namespace comes from,
in order:

1. a `/ns/{namespace}/` path prefix (`/ns/team-a/v2/models/llama/infer`);
2. an OpenAI `model` field written `namespace/name`;
3. the Service host the request was sent to: `<service>.<namespace>.svc[.<domain>]` or
   `<service>.<namespace>` (a Host header that is an IP address, `localhost` or any other
   shape gives no namespace);
4. none: allowed in local mode only, where a bare name resolves when exactly one model
   carries it.

Triton never sees these names: each route carries the UID-derived Triton name.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.errors import (
    AmbiguousModelError,
    NamespaceRequiredError,
    UnknownModelError,
)

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Scope:
    """The namespace a request is confined to (None: any, local mode) and where it came from."""

    namespace: str | None
    origin: str


def is_namespace(value: str) -> bool:
    return _LABEL.match(value) is not None


@functools.lru_cache(maxsize=1024)  # clients send the same few hosts, every request
def namespace_from_host(host: str | None) -> str | None:
    """The namespace of a Service host name (`llama.team-a.svc.cluster.local:8080` ->
    `team-a`), or None when the host is not one."""
    if not host or host.startswith("["):
        return None
    name = host.rsplit(":", 1)[0] if ":" in host else host
    parts = name.lower().rstrip(".").split(".")
    if not all(_LABEL.match(part) for part in parts) or all(p.isdigit() for p in parts):
        return None
    if len(parts) == 2 or (len(parts) >= 3 and parts[2] == "svc"):
        return parts[1]
    return None


def scope_of(prefix_namespace: str | None, host: str | None, *, local_mode: bool) -> Scope:
    """The namespace a request addresses; NamespaceRequiredError when there is none and
    bare names are not allowed (outside local mode)."""
    if prefix_namespace is not None:
        return Scope(prefix_namespace, f"the path prefix /ns/{prefix_namespace}/")
    from_host = namespace_from_host(host)
    if from_host is not None:
        return Scope(from_host, f"the Host header {host}")
    if local_mode:
        return Scope(None, "local mode")
    raise NamespaceRequiredError(
        "no namespace: call the model's Service host (<name>.<namespace>.svc) or prefix "
        "the path with /ns/<namespace>/"
    )


def split_qualified(model: str) -> tuple[str | None, str]:
    """`team-a/llama` -> ("team-a", "llama"); `llama` -> (None, "llama")."""
    namespace, slash, name = model.partition("/")
    if slash and is_namespace(namespace) and name:
        return namespace, name
    return None, model


def resolve(routes: Iterable[ModelRoute], name: str, namespace: str | None) -> ModelRoute:
    """The route users call `name` in `namespace` (None: the only one of that name)."""
    if namespace is not None:
        for route in routes:
            if route.name == name and route.namespace == namespace:
                return route
        raise UnknownModelError(f"model {name!r} not found in namespace {namespace!r}")
    found = [route for route in routes if route.name == name]
    if not found:
        raise UnknownModelError(f"model {name!r} not found")
    if len(found) > 1:
        candidates = sorted(f"{route.namespace}/{route.name}" for route in found)
        raise AmbiguousModelError(
            f"model name {name!r} is served in several namespaces: "
            f"{', '.join(candidates)}; prefix the path with /ns/<namespace>/ "
            "(or name the OpenAI model <namespace>/<name>)",
            candidates,
        )
    return found[0]


def display_ids(routes: Sequence[ModelRoute]) -> list[tuple[str, ModelRoute]]:
    """The id each route is listed under by `/v1/models`: its name, or `namespace/name`
    where another namespace uses the same name."""
    counts: dict[str, int] = {}
    for route in routes:
        counts[route.name] = counts.get(route.name, 0) + 1
    listed = [
        (route.name if counts[route.name] == 1 else f"{route.namespace}/{route.name}", route)
        for route in routes
    ]
    return sorted(listed, key=lambda item: item[0])


def statistics_names(routes: Iterable[ModelRoute]) -> dict[str, str]:
    """Each route's Triton name -> the name every model's statistics list it under,
    `namespace/name` (HTTP's `GET /v2/models/stats`, gRPC's `ModelStatistics` without a
    name): one list may hold several namespaces' models (local mode)."""
    return {route.triton_name: f"{route.namespace}/{route.name}" for route in routes}
