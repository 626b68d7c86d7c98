"""The small authentication/authorization APIs that create-only objects answer in place:
TokenRequest (`serviceaccounts/{name}/token`), SelfSubjectReview (`kubectl auth whoami`),
SelfSubjectAccessReview (`kubectl auth can-i`) and SubjectAccessReview. None is stored."""

from __future__ import annotations

import datetime
from typing import Any

from tests.support.kube_emulator.authn import Authenticator, UserInfo
from tests.support.kube_emulator.errors import ApiError, bad_request, not_found
from tests.support.kube_emulator.rbac import Authorizer
from tests.support.kube_emulator.request_info import RequestAttributes
from tests.support.kube_emulator.store import Store

_DEFAULT_EXPIRATION_S = 3600
# (group, plural) of the review endpoints this module answers, by the request's resource.
REVIEWS = frozenset(
    {
        ("authentication.k8s.io", "selfsubjectreviews"),
        ("authorization.k8s.io", "selfsubjectaccessreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    }
)


def is_review(attrs: RequestAttributes) -> bool:
    if not attrs.resource_request or attrs.verb != "create":
        return False
    if (attrs.api_group, attrs.resource) in REVIEWS:
        return not attrs.name
    return (attrs.api_group, attrs.resource, attrs.subresource) == (
        "",
        "serviceaccounts",
        "token",
    )


def answer(
    attrs: RequestAttributes,
    body: Any,
    user: UserInfo,
    *,
    store: Store,
    authenticator: Authenticator,
    authorizer: Authorizer,
) -> dict[str, Any]:
    """The review's answer (a 201 body). The caller has authorized `create` on it."""
    if not isinstance(body, dict):
        raise bad_request("the body of the request must be a JSON object")
    if attrs.resource == "serviceaccounts":
        return _token_request(attrs, body, store, authenticator)
    spec = body.get("spec") or {}
    group_version = f"{attrs.api_group}/{attrs.api_version}"
    answered: dict[str, Any] = {
        "kind": body.get("kind") or "",
        "apiVersion": group_version,
        "metadata": {"creationTimestamp": None},
    }
    if attrs.resource == "selfsubjectreviews":
        answered["kind"] = "SelfSubjectReview"
        answered["status"] = {"userInfo": user.as_json()}
        return answered
    subject = user
    if attrs.resource == "subjectaccessreviews":
        answered["kind"] = "SubjectAccessReview"
        extra = {k: tuple(v) for k, v in (spec.get("extra") or {}).items()}
        subject = UserInfo(
            spec.get("user") or "", spec.get("uid") or "", tuple(spec.get("groups") or ()), extra
        )
    else:
        answered["kind"] = "SelfSubjectAccessReview"
    resource = spec.get("resourceAttributes")
    non_resource = spec.get("nonResourceAttributes")
    if resource:
        asked = RequestAttributes(
            verb=resource.get("verb") or "",
            path="",
            resource_request=True,
            api_group=resource.get("group") or "",
            api_version=resource.get("version") or "",
            resource=resource.get("resource") or "",
            subresource=resource.get("subresource") or "",
            namespace=resource.get("namespace") or "",
            name=resource.get("name") or "",
        )
    elif non_resource:
        asked = RequestAttributes(
            verb=non_resource.get("verb") or "",
            path=non_resource.get("path") or "",
            resource_request=False,
        )
    else:
        raise ApiError(
            422,
            f'{answered["kind"]}.{attrs.api_group} "" is invalid: spec.resourceAttributes: '
            'Invalid value: "null": exactly one of nonResourceAttributes or '
            "resourceAttributes must be specified",
        )
    decision = authorizer.authorize(subject, asked)
    status: dict[str, Any] = {"allowed": decision.allowed}
    if decision.reason:
        status["reason"] = decision.reason
    answered["spec"] = spec
    answered["status"] = status
    return answered


def _token_request(
    attrs: RequestAttributes, body: dict[str, Any], store: Store, authenticator: Authenticator
) -> dict[str, Any]:
    spec = dict(body.get("spec") or {})
    expiration = int(spec.get("expirationSeconds") or _DEFAULT_EXPIRATION_S)
    if expiration < 600:
        raise ApiError(
            422,
            f'TokenRequest.authentication.k8s.io "{attrs.name}" is invalid: '
            "spec.expirationSeconds: Invalid value: "
            f"{expiration}: may not specify a duration less than 10 minutes",
        )
    ref = spec.get("boundObjectRef") or None
    pod = node = None
    if ref:
        kind, name = ref.get("kind"), ref.get("name", "")
        if kind == "Pod":
            pod = store.get(("", "pods"), attrs.namespace, name)
            found = pod
        elif kind == "Node":
            node = store.get(("", "nodes"), "", name)
            found = node
        elif kind == "Secret":
            found = store.get(("", "secrets"), attrs.namespace, name)
        else:
            raise bad_request(f"cannot bind token to object of type {kind}")
        plural = f"{str(kind).lower()}s"
        if found is None:
            raise not_found("", plural, name)
        if ref.get("uid") and ref["uid"] != found["metadata"]["uid"]:
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on {plural} "{name}": the UID in the bound '
                f"object reference ({ref['uid']}) does not match the UID in record. The object "
                "might have been deleted and then recreated",
                reason="Conflict",
            )
    try:
        token = authenticator.mint(
            attrs.namespace, attrs.name, pod=pod, node=node, expiration_seconds=expiration
        )
    except LookupError:
        raise not_found("", "serviceaccounts", attrs.name) from None
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=expiration)
    spec["expirationSeconds"] = expiration
    spec.setdefault("audiences", ["https://kubernetes.default.svc.cluster.local"])
    return {
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": attrs.name, "namespace": attrs.namespace, "creationTimestamp": None},
        "spec": spec,
        "status": {"token": token, "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")},
    }
