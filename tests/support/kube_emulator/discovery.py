"""Discovery documents: `/api`, `/apis`, `/apis/{group}`, resource lists, `/version`, and
the aggregated form (apidiscovery.k8s.io/v2) that kubectl asks `/api` and `/apis` for first;
the official Python client and kopf use the legacy documents."""

from __future__ import annotations

import hashlib
from typing import Any

from tests.support.kube_emulator.registry import TypeRegistry
from tests.support.kube_emulator.resources import ResourceType

KUBE_VERSION = (1, 34, 0)


def version() -> dict[str, str]:
    major, minor, patch = KUBE_VERSION
    return {
        "major": str(major),
        "minor": str(minor),
        "emulationMajor": str(major),
        "emulationMinor": str(minor),
        "gitVersion": f"v{major}.{minor}.{patch}",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-08-27T00:00:00Z",
        "goVersion": "go1.24.6",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def core_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def group_list(types: TypeRegistry) -> dict[str, Any]:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group(name, versions) for name, versions in types.groups()],
    }


def group(types: TypeRegistry, name: str) -> dict[str, Any] | None:
    for group_name, versions in types.groups():
        if group_name == name:
            return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}
    return None


def _storage_hash(rt: ResourceType) -> str:
    digest = hashlib.sha256(f"{rt.group}/{rt.version}/{rt.kind}".encode()).digest()
    return digest[:8].hex()


def _resource(rt: ResourceType) -> list[dict[str, Any]]:
    main: dict[str, Any] = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": list(rt.verbs),
        "storageVersionHash": _storage_hash(rt),
    }
    if rt.short_names:
        main["shortNames"] = list(rt.short_names)
    if rt.categories:
        main["categories"] = list(rt.categories)
    subs = [
        {
            "name": f"{rt.plural}/{sub}",
            "singularName": "",
            "namespaced": rt.namespaced,
            "kind": rt.kind if sub == "status" else "Scale",
            "verbs": ["get", "patch", "update"],
        }
        for sub in sorted(rt.subresources)
    ]
    return [main, *subs]


def resource_list(types: TypeRegistry, group_name: str, version_name: str) -> dict[str, Any] | None:
    found = types.in_group_version(group_name, version_name)
    if not found:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group_name}/{version_name}" if group_name else version_name,
        "resources": [entry for rt in found for entry in _resource(rt)],
    }


# -- aggregated discovery (apidiscovery.k8s.io/v2), what kubectl ≥ 1.30 asks for first -----

AGGREGATED_MEDIA_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def wants_aggregated(accept: str) -> bool:
    return any(
        "as=APIGroupDiscoveryList" in part and "v=v2;" in part + ";" and "apidiscovery" in part
        for part in accept.replace(" ", "").split(",")
    )


def _kind_ref(rt: ResourceType, kind: str) -> dict[str, str]:
    return {"group": rt.group, "version": rt.version, "kind": kind}


def _aggregated_resource(rt: ResourceType) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "resource": rt.plural,
        "responseKind": _kind_ref(rt, rt.kind),
        "scope": "Namespaced" if rt.namespaced else "Cluster",
        "singularResource": rt.singular,
        "verbs": list(rt.verbs),
    }
    if rt.short_names:
        entry["shortNames"] = list(rt.short_names)
    if rt.categories:
        entry["categories"] = list(rt.categories)
    if rt.subresources:
        entry["subresources"] = [
            {
                "subresource": sub,
                "responseKind": _kind_ref(rt, rt.kind if sub == "status" else "Scale"),
                "verbs": ["get", "patch", "update"],
            }
            for sub in sorted(rt.subresources)
        ]
    return entry


def _aggregated_version(types: TypeRegistry, group_name: str, version_name: str) -> dict[str, Any]:
    return {
        "version": version_name,
        "resources": [
            _aggregated_resource(rt) for rt in types.in_group_version(group_name, version_name)
        ],
        "freshness": "Current",
    }


def aggregated(types: TypeRegistry, *, core: bool) -> dict[str, Any]:
    """The APIGroupDiscoveryList for `/api` (core) or `/apis` (every other group)."""
    items: list[dict[str, Any]]
    if core:
        items = [{"metadata": {}, "versions": [_aggregated_version(types, "", "v1")]}]
    else:
        items = [
            {
                "metadata": {"name": name},
                "versions": [_aggregated_version(types, name, v) for v in versions],
            }
            for name, versions in types.groups()
        ]
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    }
