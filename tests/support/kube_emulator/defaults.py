"""What the real server fills in or converts for built-in types on writes.

Namespaces: `spec.finalizers`, `status.phase`, the `kubernetes.io/metadata.name` label.
CRDs: `names.singular` and `names.listKind`. Secrets: `stringData` merged into base64 `data`.
Services: type ClusterIP, an allocated clusterIP (kept on updates), port protocol and
targetPort defaults.
"""

from __future__ import annotations

import base64
import copy
import itertools
from typing import Any

from tests.support.kube_emulator.resources import ResourceType

_CLUSTER_IPS = (f"10.96.{n // 254}.{n % 254 + 1}" for n in itertools.count(1))


def on_create(rt: ResourceType, obj: dict[str, Any]) -> None:
    _common(rt, obj)
    if rt.key == ("", "namespaces"):
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj["status"] = {"phase": "Active"}
    if rt.key == ("", "services"):
        spec = obj.setdefault("spec", {})
        if spec.get("type", "ClusterIP") != "ExternalName" and not spec.get("clusterIP"):
            spec["clusterIP"] = next(_CLUSTER_IPS)
        if spec.get("clusterIP"):
            spec.setdefault("clusterIPs", [spec["clusterIP"]])


def on_update(rt: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> None:
    _common(rt, new)
    if rt.key == ("", "services"):
        old_spec, spec = old.get("spec") or {}, new.setdefault("spec", {})
        for kept in ("clusterIP", "clusterIPs"):
            if kept in old_spec and not spec.get(kept):
                spec[kept] = old_spec[kept]
    if rt.key == ("", "namespaces"):  # a namespace's finalizers change only via /finalize
        new["spec"] = copy.deepcopy(old.get("spec", {}))


def _common(rt: ResourceType, obj: dict[str, Any]) -> None:
    if rt.key == ("", "namespaces"):
        labels = obj["metadata"].setdefault("labels", {})
        labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    elif rt.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
        names = obj.get("spec", {}).get("names", {})
        if names.get("kind"):
            names.setdefault("singular", names["kind"].lower())
            names.setdefault("listKind", f"{names['kind']}List")
    elif rt.key == ("", "secrets"):
        string_data = obj.pop("stringData", None) or {}
        if string_data:
            data = obj.setdefault("data", {})
            for key, value in string_data.items():
                data[key] = base64.b64encode(str(value).encode()).decode()
        obj.setdefault("type", "Opaque")
    elif rt.key == ("", "services"):
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
