"""The request path's front: authenticate (and impersonate), authorize, log; and validating
admission policies with the request's user. Off (the default), it only logs, with no user.
The log names the user a request acts as (the impersonated one under `--as`).

The authenticated user reaches admission, which runs deep inside `Cluster` writes, through
a context variable set for the request's task; writes made directly by tests (seeding)
have no request and skip the policies, as objects created before a policy would.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tests.support.kube_emulator import protobuf, reviews
from tests.support.kube_emulator.audit import RequestLog, RequestRecord
from tests.support.kube_emulator.authn import Authenticator, UserInfo
from tests.support.kube_emulator.errors import ApiError, bad_request
from tests.support.kube_emulator.handlers import error_response, json_response
from tests.support.kube_emulator.impersonation import impersonated
from tests.support.kube_emulator.operations import Cluster, WriteAttempt
from tests.support.kube_emulator.rbac import Authorizer, forbidden
from tests.support.kube_emulator.request_info import attributes

if TYPE_CHECKING:
    from tests.support.kube_emulator.admission_policies import PolicyEvaluator

_USER: contextvars.ContextVar[UserInfo | None] = contextvars.ContextVar(
    "kube_emulator_user", default=None
)
_RECORD_KEY = web.RequestKey("kube_emulator_record", RequestRecord)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Security:
    def __init__(self, cluster: Cluster, admin_token: str, *, enabled: bool) -> None:
        self.enabled = enabled
        self.cluster = cluster
        store = cluster.store
        self.authenticator = Authenticator(
            admin_token, lambda g, p, ns, name: store.get((g, p), ns, name)
        )
        self.authorizer = Authorizer(store)
        self.log = RequestLog()
        self.policies: PolicyEvaluator | None = None
        if enabled:
            # Imported only when used: cel-python adds to every emulator's start otherwise.
            from tests.support.kube_emulator.admission_policies import PolicyEvaluator

            self.policies = PolicyEvaluator(store)
            cluster.validating_admission = self._admit

    def install(self, app: web.Application) -> None:
        app.on_response_prepare.append(self._on_prepare)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        attrs = attributes(request.method, request.path, dict(request.query))
        record = RequestRecord(
            user="", verb=attrs.verb, api_group=attrs.api_group, resource=attrs.resource,
            subresource=attrs.subresource, namespace=attrs.namespace, name=attrs.name,
            allowed=True, code=0, method=request.method, path=request.path,
        )  # fmt: skip
        request[_RECORD_KEY] = record
        if not self.enabled:
            return await handler(request)
        user = self.authenticator.authenticate(request.headers.get("Authorization"))
        if user is None:
            request[_RECORD_KEY] = replace(record, allowed=False)
            return error_response(ApiError(401, "Unauthorized"))
        try:
            headers = [(k.lower(), v) for k, v in request.headers.items()]
            user = impersonated(request.headers, headers, user, self.authorizer)
        except ApiError as e:
            request[_RECORD_KEY] = replace(record, user=user.username, allowed=False)
            return error_response(e)
        decision = self.authorizer.authorize(user, attrs)
        request[_RECORD_KEY] = replace(record, user=user.username, allowed=decision.allowed)
        if not decision.allowed:
            return error_response(forbidden(user, attrs, decision.reason))
        if request.path.startswith("/emulator/") and not user.is_master:
            return error_response(forbidden(user, attrs))
        token = _USER.set(user)
        try:
            if reviews.is_review(attrs):
                return await self._review(request, attrs, user)
            return await handler(request)
        except ApiError as e:
            return error_response(e)
        finally:
            _USER.reset(token)

    async def _review(self, request: web.Request, attrs: Any, user: UserInfo) -> web.Response:
        raw = await request.read()
        if request.content_type == protobuf.MEDIA_TYPE:  # what kubectl's typed client sends
            body: Any = protobuf.decode(raw)
        else:
            try:
                body = json.loads(raw or b"null")
            except ValueError as e:
                raise bad_request(f"error decoding request body: {e}") from e
        answered = reviews.answer(
            attrs, body, user, store=self.cluster.store,
            authenticator=self.authenticator, authorizer=self.authorizer,
        )  # fmt: skip
        return json_response(answered, 201)

    def mark_fault(self, request: web.Request, fault: str) -> None:
        """The answer to `request` is an injected failure: its record says which."""
        record = request.get(_RECORD_KEY)
        if record is not None:
            request[_RECORD_KEY] = replace(record, fault=fault)

    async def _on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        record = request.get(_RECORD_KEY)
        if record is not None:
            self.log.append(replace(record, code=response.status))
            del request[_RECORD_KEY]  # one record per request

    def _admit(self, attempt: WriteAttempt) -> list[str]:
        from tests.support.kube_emulator.admission_policies import AdmissionRequest

        user = _USER.get()
        if user is None or self.policies is None:
            return []
        meta = (attempt.object or attempt.old_object or {}).get("metadata") or {}
        return self.policies.validate(
            AdmissionRequest(
                rt=attempt.rt, operation=attempt.operation,
                subresource=attempt.subresource or "", name=meta.get("name", ""),
                namespace=meta.get("namespace", ""), object=attempt.object,
                old_object=attempt.old_object, user=user, dry_run=attempt.dry_run,
            )
        )  # fmt: skip
