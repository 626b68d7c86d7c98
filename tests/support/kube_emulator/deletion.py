"""Deletion as the real server and its controllers do it: finalizers hold an object with a
deletionTimestamp (generation bumped), delete preconditions, garbage collection of
dependents whose owners are all gone (background propagation), namespace termination
(contents deleted, the namespace removed once empty), and CRD deletion (its instances and
watches dropped)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from tests.support.kube_emulator import clock
from tests.support.kube_emulator.errors import conflict
from tests.support.kube_emulator.resources import ResourceType

if TYPE_CHECKING:
    from tests.support.kube_emulator.operations import Cluster

_CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
_NS_KEY = ("", "namespaces")


def delete(
    cluster: Cluster,
    rt: ResourceType,
    namespace: str | None,
    name: str,
    options: dict[str, Any] | None = None,
    *,
    dry_run: bool = False,
) -> dict[str, Any]:
    """The deleted object, or the one now held by finalizers (with its deletionTimestamp)."""
    current = cluster.get(rt, namespace, name)
    meta = current["metadata"]
    preconditions = (options or {}).get("preconditions") or {}
    if preconditions.get("uid") and preconditions["uid"] != meta["uid"]:
        raise conflict(
            rt.group, rt.plural, name,
            f"Precondition failed: UID in precondition: {preconditions['uid']}, "
            f"UID in object meta: {meta['uid']}",
        )  # fmt: skip
    rv = preconditions.get("resourceVersion")
    if rv and rv != meta["resourceVersion"]:
        raise conflict(
            rt.group, rt.plural, name,
            f"Precondition failed: ResourceVersion in precondition: {rv}, "
            f"ResourceVersion in object meta: {meta['resourceVersion']}",
        )  # fmt: skip
    pending = bool(meta.get("finalizers")) or rt.key == _NS_KEY
    if not pending:
        if dry_run:
            return current
        return remove(cluster, rt, current)
    if meta.get("deletionTimestamp"):
        return current
    marked = copy.deepcopy(current)
    marked["metadata"]["deletionTimestamp"] = clock.now()
    marked["metadata"]["deletionGracePeriodSeconds"] = 0
    if rt.has_generation:
        marked["metadata"]["generation"] = meta.get("generation", 0) + 1
    if rt.key == _NS_KEY:
        marked["status"] = {"phase": "Terminating"}
    if dry_run:
        return marked
    stored = cluster.store.put(rt.key, marked)
    if rt.key == _NS_KEY:
        _terminate_namespace(cluster, name)
        return cluster.store.get(rt.key, "", name) or stored
    return cluster.as_version(rt, stored)


def remove(cluster: Cluster, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    if rt.key == _CRD_KEY:
        _drop_crd(cluster, obj)
    gone = cluster.store.remove(rt.key, meta.get("namespace", ""), meta["name"])
    cluster.applied.forget(meta["uid"])
    _collect_garbage(cluster, meta["uid"])
    namespace = meta.get("namespace")
    if namespace:
        _maybe_finish_namespace(cluster, namespace)
    return cluster.as_version(rt, gone)


def _drop_crd(cluster: Cluster, crd: dict[str, Any]) -> None:
    group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
    for obj in cluster.store.items((group, plural)):
        cluster.store.remove(
            (group, plural), obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
        )
    cluster.types.remove_key(group, plural)
    cluster.store.close_watches((group, plural))


def _collect_garbage(cluster: Cluster, owner_uid: str) -> None:
    """Delete dependents whose owners are all gone (background propagation)."""
    live = {obj["metadata"]["uid"] for _, obj in cluster.store.all_objects()}
    for key, obj in list(cluster.store.all_objects()):
        refs = obj["metadata"].get("ownerReferences") or []
        owned = any(r.get("uid") == owner_uid for r in refs)
        if not owned or any(r.get("uid") in live for r in refs):
            continue
        rt = cluster.types.storage_type(*key)
        namespace, name = obj["metadata"].get("namespace"), obj["metadata"]["name"]
        if rt is not None and cluster.store.get(key, namespace or "", name) is not None:
            delete(cluster, rt, namespace, name)  # the controllers' deletes: no admission


def _terminate_namespace(cluster: Cluster, namespace: str) -> None:
    for key in list(cluster.store.namespaces_in_use(namespace)):
        rt = cluster.types.storage_type(*key)
        if rt is None:
            continue
        for obj in cluster.store.items(key, namespace):
            if cluster.store.get(key, namespace, obj["metadata"]["name"]) is not None:
                delete(cluster, rt, namespace, obj["metadata"]["name"])
    _maybe_finish_namespace(cluster, namespace)


def _maybe_finish_namespace(cluster: Cluster, namespace: str) -> None:
    ns = cluster.store.get(_NS_KEY, "", namespace)
    if ns is None or not ns["metadata"].get("deletionTimestamp"):
        return
    if any(True for _ in cluster.store.namespaces_in_use(namespace)):
        return
    if ns["metadata"].get("finalizers"):
        return
    cluster.store.remove(_NS_KEY, "", namespace)
