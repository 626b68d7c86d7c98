"""The resource types the emulator serves: built-in ones, and those CRDs register."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modelswap_api.validation import SchemaValidator

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass
class ResourceType:
    """One resource of one group/version, as discovery, routing and storage see it."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    # Custom resources: merge/JSON patch only, PUT needs a resourceVersion, generation counts.
    custom: bool = False
    # Whether the status given on create is kept (nodes), or cleared (status subresource).
    status_on_create: bool = False
    has_generation: bool = False
    printer_columns: tuple[dict[str, Any], ...] = ()
    selectable_fields: tuple[str, ...] = ()
    schema: dict[str, Any] | None = None
    validator: SchemaValidator | None = field(default=None, repr=False)
    # For built-in types: the SMP list merge keys by field name (`containers` → `name`).
    merge_keys: dict[str, str] = field(default_factory=dict)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Storage key: one store per group and plural, shared by all served versions."""
        return (self.group, self.plural)

    @property
    def group_resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def verbs(self) -> tuple[str, ...]:
        return ALL_VERBS


_POD_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "topologySpreadConstraints": "topologyKey",
}


def _builtin(
    group: str,
    version: str,
    plural: str,
    kind: str,
    *,
    namespaced: bool,
    short_names: tuple[str, ...] = (),
    status: bool = False,
    status_on_create: bool = False,
    merge_keys: dict[str, str] | None = None,
    categories: tuple[str, ...] = (),
    generation: bool = False,
) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        singular=kind.lower(),
        kind=kind,
        namespaced=namespaced,
        short_names=short_names,
        categories=categories,
        subresources=frozenset({"status"}) if status else frozenset(),
        status_on_create=status_on_create,
        has_generation=generation,
        merge_keys={"ownerReferences": "uid", **(merge_keys or {})},
    )


def _workload(plural: str, kind: str, short_name: str) -> ResourceType:
    return _builtin(
        "apps", "v1", plural, kind, namespaced=True, short_names=(short_name,), status=True,
        categories=("all",), merge_keys=_POD_MERGE_KEYS, generation=True,
    )  # fmt: skip


def builtin_types() -> list[ResourceType]:
    """Core and built-in group resources the operator, its chart and users touch."""
    node_keys = {"conditions": "type", "addresses": "type", "taints": "key"}
    types = [
        _builtin("", "v1", "namespaces", "Namespace", namespaced=False, short_names=("ns",),
                 status=True),
        _builtin("", "v1", "nodes", "Node", namespaced=False, short_names=("no",), status=True,
                 status_on_create=True, merge_keys=node_keys),
        _builtin("", "v1", "pods", "Pod", namespaced=True, short_names=("po",), status=True,
                 categories=("all",), merge_keys=_POD_MERGE_KEYS),
        _builtin("", "v1", "events", "Event", namespaced=True, short_names=("ev",)),
        _builtin("", "v1", "secrets", "Secret", namespaced=True),
        _builtin("", "v1", "configmaps", "ConfigMap", namespaced=True, short_names=("cm",)),
        _builtin("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True,
                 short_names=("sa",)),
        _builtin("", "v1", "services", "Service", namespaced=True, short_names=("svc",),
                 status=True, categories=("all",), merge_keys={"ports": "port"}),
        _builtin("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", namespaced=True,
                 short_names=("pvc",), status=True),
        _workload("deployments", "Deployment", "deploy"),
        _workload("daemonsets", "DaemonSet", "ds"),
        _workload("statefulsets", "StatefulSet", "sts"),
        _builtin("batch", "v1", "jobs", "Job", namespaced=True, status=True,
                 categories=("all",), merge_keys=_POD_MERGE_KEYS, generation=True),
        _builtin("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
        _builtin("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", namespaced=True),
        _builtin("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True,
                 short_names=("pdb",), status=True),
        _builtin("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy",
                 namespaced=True, short_names=("netpol",)),
        _builtin("rbac.authorization.k8s.io", "v1", "roles", "Role", namespaced=True),
        _builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding",
                 namespaced=True),
        _builtin("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole",
                 namespaced=False),
        _builtin("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
                 namespaced=False),
        _builtin("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies",
                 "ValidatingAdmissionPolicy", namespaced=False, status=True, generation=True),
        _builtin("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
                 "ValidatingAdmissionPolicyBinding", namespaced=False, generation=True),
        _builtin("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                 "CustomResourceDefinition", namespaced=False, short_names=("crd", "crds"),
                 status=True, generation=True),
    ]  # fmt: skip
    return types


def from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of a CRD (validators are attached by the caller)."""
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for entry in spec.get("versions", []):
        if not entry.get("served", True):
            continue
        subresources = entry.get("subresources") or {}
        out.append(
            ResourceType(
                group=spec["group"],
                version=entry["name"],
                plural=names["plural"],
                singular=names.get("singular") or names["kind"].lower(),
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=frozenset(k for k in ("status", "scale") if k in subresources),
                custom=True,
                has_generation=True,
                printer_columns=tuple(entry.get("additionalPrinterColumns") or ()),
                selectable_fields=tuple(
                    f["jsonPath"].lstrip(".") for f in entry.get("selectableFields") or ()
                ),
                schema=(entry.get("schema") or {}).get("openAPIV3Schema"),
            )
        )
    return out
