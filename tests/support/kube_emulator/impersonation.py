"""`Impersonate-*` headers (`kubectl --as`, `--as-group`): acting as another user, with
the `impersonate` verb authorized per impersonated attribute as the apiserver's filter
does (users, serviceaccounts, groups, userextras/<key>, uids)."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote

from tests.support.kube_emulator.authn import AUTHENTICATED, UserInfo, service_account_user
from tests.support.kube_emulator.errors import ApiError
from tests.support.kube_emulator.rbac import Authorizer
from tests.support.kube_emulator.request_info import RequestAttributes

_EXTRA_PREFIX = "impersonate-extra-"
_SA_PREFIX = "system:serviceaccount:"


def _check(
    authorizer: Authorizer,
    acting: UserInfo,
    resource: str,
    name: str,
    *,
    group: str = "",
    namespace: str = "",
) -> None:
    attrs = RequestAttributes(
        verb="impersonate", path="", resource_request=True, api_group=group,
        resource=resource.split("/", 1)[0], subresource=resource.partition("/")[2],
        namespace=namespace, name=name,
    )  # fmt: skip
    if not authorizer.authorize(acting, attrs).allowed:
        kind = resource.split("/", 1)[0]
        raise ApiError(
            403,
            f'{kind} "{name}" is forbidden: User "{acting.username}" cannot impersonate '
            f'resource "{resource}" in API group "{group}"'
            + (f' in the namespace "{namespace}"' if namespace else " at the cluster scope"),
            reason="Forbidden",
            details={"name": name, "kind": kind, **({"group": group} if group else {})},
        )


def impersonated(
    headers: Mapping[str, str],
    getall: list[tuple[str, str]],
    acting: UserInfo,
    authorizer: Authorizer,
) -> UserInfo:
    """The user to act as (`acting` itself without `Impersonate-User`); 403 when not allowed.
    `getall`: every header as (lower-cased name, value), for the repeated ones."""
    username = headers.get("Impersonate-User")
    groups = [v for k, v in getall if k == "impersonate-group"]
    extras = [(k[len(_EXTRA_PREFIX) :], v) for k, v in getall if k.startswith(_EXTRA_PREFIX)]
    uid = headers.get("Impersonate-Uid", "")
    if not username:
        if groups or extras or uid:
            raise ApiError(500, "requested impersonation without a user")
        return acting
    if username.startswith(_SA_PREFIX) and username.count(":") == 3:
        namespace, name = username[len(_SA_PREFIX) :].split(":")
        _check(authorizer, acting, "serviceaccounts", name, namespace=namespace)
        default_groups = list(service_account_user(namespace, name, "").groups)
    else:
        _check(authorizer, acting, "users", username)
        default_groups = []
    for group in groups:
        _check(authorizer, acting, "groups", group)
    extra: dict[str, tuple[str, ...]] = {}
    for escaped, value in extras:
        key = unquote(escaped)  # header names carry extra keys percent-encoded
        _check(authorizer, acting, f"userextras/{key}", value, group="authentication.k8s.io")
        extra[key] = (*extra.get(key, ()), value)
    if uid:
        _check(authorizer, acting, "uids", uid, group="authentication.k8s.io")
    all_groups = groups or default_groups
    if AUTHENTICATED not in all_groups and "system:unauthenticated" not in all_groups:
        all_groups.append(AUTHENTICATED)
    return UserInfo(username, uid, tuple(all_groups), extra)
