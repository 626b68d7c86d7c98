"""What a request asks to do, in the authorizer's terms (the apiserver's RequestInfo):
verb, API group, resource, subresource, namespace, name -- or a non-resource path."""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.kube_emulator.routing import parse_resource_path

_ITEM_VERBS = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_COLLECTION_VERBS = {"GET": "list", "POST": "create", "DELETE": "deletecollection"}


@dataclass(frozen=True)
class RequestAttributes:
    verb: str
    path: str
    resource_request: bool
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def resource_with_subresource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def _name_from_field_selector(selector: str | None) -> str:
    """A list/watch narrowed to `metadata.name=X` is authorized as naming X (as real)."""
    for term in (selector or "").split(","):
        key, op, value = term.partition("==" if "==" in term else "=")
        if op and key.strip() == "metadata.name" and not key.strip().endswith("!"):
            return value.strip()
    return ""


def attributes(method: str, path: str, query: dict[str, str]) -> RequestAttributes:
    parsed = parse_resource_path(path)
    if parsed is None:
        return RequestAttributes(verb=method.lower(), path=path, resource_request=False)
    if parsed.name is None:
        verb = _COLLECTION_VERBS.get(method, method.lower())
    else:
        verb = _ITEM_VERBS.get(method, "create" if method == "POST" else method.lower())
    name = parsed.name or ""
    if verb in ("list", "get") and query.get("watch") in ("true", "1"):
        verb = "watch"
    if verb in ("list", "watch") and not name:
        name = _name_from_field_selector(query.get("fieldSelector"))
    namespace = parsed.namespace or ""
    if parsed.group == "" and parsed.plural == "namespaces" and parsed.name:
        namespace = parsed.name  # a namespace's own requests are namespaced to it
    return RequestAttributes(
        verb=verb,
        path=path,
        resource_request=True,
        api_group=parsed.group,
        api_version=parsed.version,
        resource=parsed.plural,
        subresource=parsed.subresource or "",
        namespace=namespace,
        name=name,
    )
