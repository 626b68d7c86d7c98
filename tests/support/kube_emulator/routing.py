"""URL paths of the Kubernetes API, parsed into what a request addresses."""

from __future__ import annotations

from dataclasses import dataclass

_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


@dataclass(frozen=True)
class ResourcePath:
    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_resource_path(path: str) -> ResourcePath | None:
    """`/api/v1/namespaces/ns/configmaps/x` → (``, v1, configmaps, ns, x); None if not one."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if (
        rest[0] == "namespaces"
        and len(rest) >= 3
        and not (len(rest) == 3 and rest[2] in _NAMESPACE_SUBRESOURCES)
    ):
        namespace, rest = rest[1], rest[2:]
    if len(rest) > 3:
        return None
    return ResourcePath(
        group=group,
        version=version,
        plural=rest[0],
        namespace=namespace,
        name=rest[1] if len(rest) > 1 else None,
        subresource=rest[2] if len(rest) > 2 else None,
    )
