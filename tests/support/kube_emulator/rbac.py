"""The RBAC authorizer over the Roles, ClusterRoles and bindings stored in the emulator.

Matching follows kubernetes/plugin/pkg/auth/authorizer/rbac: a request is allowed when any
rule of any role bound to the user (by name, group, or ServiceAccount) covers its verb,
API group, resource (`resource/subresource`, `*`, `*/subresource`), resourceNames, or its
non-resource URL (exact, or a `*`-suffixed prefix). A RoleBinding grants only in its own
namespace; a ClusterRoleBinding everywhere, cluster scope and non-resource URLs included.
`system:masters` is allowed everything without looking. ClusterRole aggregation is not
evaluated (aggregated roles' `rules` are used as stored).

The server's default roles that clients rely on (`system:discovery`,
`system:basic-user`, `system:public-info-viewer`, `cluster-admin`) are created at start
as ordinary objects, as a real cluster has them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tests.support.kube_emulator.authn import AUTHENTICATED, MASTERS, UserInfo
from tests.support.kube_emulator.errors import ApiError
from tests.support.kube_emulator.request_info import RequestAttributes
from tests.support.kube_emulator.store import Store

GROUP = "rbac.authorization.k8s.io"
_ROLES, _CLUSTER_ROLES = (GROUP, "roles"), (GROUP, "clusterroles")
_BINDINGS, _CLUSTER_BINDINGS = (GROUP, "rolebindings"), (GROUP, "clusterrolebindings")


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""  # why, when a binding points at a missing role (as RBAC words it)


def _any(values: Sequence[str] | None, wanted: str) -> bool:
    return any(v in ("*", wanted) for v in values or ())


def _resource_matches(rule: dict[str, Any], attrs: RequestAttributes) -> bool:
    combined = attrs.resource_with_subresource
    for resource in rule.get("resources") or ():
        if resource in ("*", combined):
            return True
        if attrs.subresource and resource == f"*/{attrs.subresource}":
            return True
    return False


def _non_resource_matches(rule: dict[str, Any], path: str) -> bool:
    for url in rule.get("nonResourceURLs") or ():
        if url in ("*", path) or (url.endswith("*") and path.startswith(url[:-1])):
            return True
    return False


def rule_allows(rule: dict[str, Any], attrs: RequestAttributes) -> bool:
    if not _any(rule.get("verbs"), attrs.verb):
        return False
    if not attrs.resource_request:
        return _non_resource_matches(rule, attrs.path)
    if not _any(rule.get("apiGroups"), attrs.api_group) or not _resource_matches(rule, attrs):
        return False
    names = rule.get("resourceNames") or ()
    return not names or attrs.name in names


def _subject_matches(subject: dict[str, Any], user: UserInfo, binding_namespace: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name", "")
    if kind == "User":
        return bool(name == user.username)
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return f"system:serviceaccount:{namespace}:{name}" == user.username
    return False


class Authorizer:
    def __init__(self, store: Store) -> None:
        self._store = store

    def _role(self, binding: dict[str, Any], errors: list[str]) -> dict[str, Any] | None:
        ref = binding.get("roleRef") or {}
        namespace = binding["metadata"].get("namespace") or ""
        if ref.get("kind") == "Role":
            role = self._store.get(_ROLES, namespace, ref.get("name", ""))
            what = f'role.{GROUP} "{ref.get("name")}" not found'
        else:
            role = self._store.get(_CLUSTER_ROLES, "", ref.get("name", ""))
            what = f'clusterrole.{GROUP} "{ref.get("name")}" not found'
        if role is None:
            errors.append(what)
        return role

    def rules_for(
        self, user: UserInfo, namespace: str, errors: list[str] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every rule that applies to `user` in `namespace` ("" = cluster scope only)."""
        errors = [] if errors is None else errors
        for binding in self._store.items(_CLUSTER_BINDINGS):
            if any(_subject_matches(s, user, "") for s in binding.get("subjects") or ()):
                role = self._role(binding, errors)
                yield from (role or {}).get("rules") or ()
        if not namespace:
            return
        for binding in self._store.items(_BINDINGS, namespace):
            if any(_subject_matches(s, user, namespace) for s in binding.get("subjects") or ()):
                role = self._role(binding, errors)
                yield from (role or {}).get("rules") or ()

    def authorize(self, user: UserInfo, attrs: RequestAttributes) -> Decision:
        if user.is_master:
            return Decision(True)
        errors: list[str] = []
        namespace = attrs.namespace if attrs.resource_request else ""
        for rule in self.rules_for(user, namespace, errors):
            if rule_allows(rule, attrs):
                return Decision(True)
        return Decision(False, "RBAC: " + ", ".join(errors) if errors else "")


def forbidden(user: UserInfo, attrs: RequestAttributes, reason: str = "") -> ApiError:
    """403 worded as the apiserver's `responsewriters.Forbidden`."""
    if not attrs.resource_request:
        text = f'User "{user.username}" cannot {attrs.verb} path "{attrs.path}"'
    elif attrs.namespace:
        text = (
            f'User "{user.username}" cannot {attrs.verb} resource '
            f'"{attrs.resource_with_subresource}" in API group "{attrs.api_group}" in the '
            f'namespace "{attrs.namespace}"'
        )
    else:
        text = (
            f'User "{user.username}" cannot {attrs.verb} resource '
            f'"{attrs.resource_with_subresource}" in API group "{attrs.api_group}" at the '
            "cluster scope"
        )
    if reason:
        text = f"{text}: {reason}"
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    if not attrs.resource_request:
        message = f"forbidden: {text}"
    elif attrs.name:
        message = f'{qualified} "{attrs.name}" is forbidden: {text}'
    else:
        message = f"{qualified} is forbidden: {text}"
    details: dict[str, Any] = {"kind": attrs.resource}
    if attrs.name:
        details["name"] = attrs.name
    if attrs.api_group:
        details["group"] = attrs.api_group
    return ApiError(403, message, reason="Forbidden", details=details)


def _cluster_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "rules": rules,
    }


def _cluster_binding(name: str, groups: Sequence[str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
        },
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": g} for g in groups],
    }


def bootstrap_objects() -> list[dict[str, Any]]:
    """The default roles and bindings of kube-apiserver's bootstrap policy that matter to
    clients: discovery and self-reviews for every authenticated user, and cluster-admin."""
    health = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
    discovery = ["/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", *health]
    self_reviews = [
        {"apiGroups": ["authorization.k8s.io"], "verbs": ["create"],
         "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]},
        {"apiGroups": ["authentication.k8s.io"], "verbs": ["create"],
         "resources": ["selfsubjectreviews"]},
    ]  # fmt: skip
    return [
        _cluster_role(
            "cluster-admin",
            [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ],
        ),
        _cluster_binding("cluster-admin", [MASTERS]),
        _cluster_role("system:discovery", [{"nonResourceURLs": discovery, "verbs": ["get"]}]),
        _cluster_binding("system:discovery", [AUTHENTICATED]),
        _cluster_role("system:basic-user", self_reviews),
        _cluster_binding("system:basic-user", [AUTHENTICATED]),
        _cluster_role("system:public-info-viewer", [{"nonResourceURLs": health, "verbs": ["get"]}]),
        _cluster_binding("system:public-info-viewer", [AUTHENTICATED, "system:unauthenticated"]),
    ]
