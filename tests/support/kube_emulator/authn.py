"""Bearer-token authentication: a static admin token and ServiceAccount tokens.

A ServiceAccount token here is an opaque random string, not a JWT: no client reads a token,
and the server only needs what the real token authenticator derives from one -- the
ServiceAccount (still existing, same UID, as a bound token is re-checked on every request)
and, for a token bound to a Pod or a Node, the `authentication.kubernetes.io/*` extra the
user info carries. Unknown, absent or revoked tokens authenticate nobody (401: anonymous
requests are off, as with `--anonymous-auth=false`).
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
ADMIN_USER = "kubernetes-admin"
NODE_NAME = "authentication.kubernetes.io/node-name"
NODE_UID = "authentication.kubernetes.io/node-uid"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


@dataclass(frozen=True)
class UserInfo:
    """Who a request is from, as `request.userInfo` and the authorizer see it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"username": self.username, "groups": list(self.groups)}
        if self.uid:
            body["uid"] = self.uid
        if self.extra:
            body["extra"] = {k: list(v) for k, v in self.extra.items()}
        return body

    @property
    def is_master(self) -> bool:
        return MASTERS in self.groups


def service_account_user(namespace: str, name: str, sa_uid: str) -> UserInfo:
    return UserInfo(
        username=f"system:serviceaccount:{namespace}:{name}",
        uid=sa_uid,
        groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
    )


@dataclass(frozen=True)
class _Minted:
    namespace: str
    service_account: str
    sa_uid: str
    extra: Mapping[str, tuple[str, ...]]
    expires_at: float | None  # time.time() seconds
    # Objects the token is bound to: (group, plural, namespace, name, uid); gone → invalid.
    bound_to: tuple[tuple[str, str, str, str, str], ...] = ()


# Looks an object up by (group, plural, namespace or "", name); None when absent.
Lookup = Callable[[str, str, str, str], dict[str, Any] | None]


class Authenticator:
    def __init__(self, admin_token: str, lookup: Lookup) -> None:
        self.admin_token = admin_token
        self.admin = UserInfo(ADMIN_USER, groups=(MASTERS, AUTHENTICATED))
        self._lookup = lookup
        self._tokens: dict[str, _Minted] = {}

    def mint(
        self,
        namespace: str,
        service_account: str,
        *,
        node: dict[str, Any] | None = None,
        node_name: str | None = None,
        pod: dict[str, Any] | None = None,
        expiration_seconds: int | None = None,
    ) -> str:
        """A token for an existing ServiceAccount; LookupError if it does not exist.

        `pod`: bind to that Pod (pod-name/uid, and the node it runs on when scheduled);
        `node`: bind to that Node object; `node_name` alone: the node-name extra without a
        Node object (what a test that seeds no Nodes needs)."""
        sa = self._lookup("", "serviceaccounts", namespace, service_account)
        if sa is None:
            raise LookupError(f'serviceaccounts "{service_account}" not found in {namespace}')
        extra: dict[str, tuple[str, ...]] = {CREDENTIAL_ID: (f"JTI={uuid.uuid4()}",)}
        bound: list[tuple[str, str, str, str, str]] = []
        if pod is not None:
            meta = pod["metadata"]
            extra[POD_NAME], extra[POD_UID] = (meta["name"],), (meta["uid"],)
            bound.append(("", "pods", namespace, meta["name"], meta["uid"]))
            node_name = node_name or (pod.get("spec") or {}).get("nodeName")
            if node is None and node_name:
                node = self._lookup("", "nodes", "", node_name)
        if node is not None:
            node_name = node["metadata"]["name"]
            extra[NODE_UID] = (node["metadata"]["uid"],)
            if (
                pod is None
            ):  # a token bound to a Node dies with it; one bound to a Pod, with the Pod
                bound.append(("", "nodes", "", node_name, node["metadata"]["uid"]))
        if node_name:
            extra[NODE_NAME] = (node_name,)
        token = secrets.token_urlsafe(32)
        self._tokens[token] = _Minted(
            namespace=namespace,
            service_account=service_account,
            sa_uid=sa["metadata"]["uid"],
            extra=extra,
            expires_at=time.time() + expiration_seconds if expiration_seconds else None,
            bound_to=tuple(bound),
        )
        return token

    def authenticate(self, authorization: str | None) -> UserInfo | None:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        if secrets.compare_digest(token, self.admin_token):
            return self.admin
        minted = self._tokens.get(token)
        if minted is None:
            return None
        if minted.expires_at is not None and time.time() >= minted.expires_at:
            return None
        sa = self._lookup("", "serviceaccounts", minted.namespace, minted.service_account)
        if sa is None or sa["metadata"]["uid"] != minted.sa_uid:
            return None
        for group, plural, namespace, name, uid in minted.bound_to:
            obj = self._lookup(group, plural, namespace, name)
            if obj is None or obj["metadata"]["uid"] != uid:
                return None
        user = service_account_user(minted.namespace, minted.service_account, minted.sa_uid)
        return UserInfo(user.username, user.uid, user.groups, minted.extra)
