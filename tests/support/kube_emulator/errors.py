"""API errors as the real server words them, rendered as `meta.k8s.io/v1` Status objects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
}


class ApiError(Exception):
    """An error answer: HTTP code, Status reason, message and optional details."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def group_resource(group: str, plural: str) -> str:
    """`modeldeployments.modelswap.io`, or `configmaps` for the core group."""
    return f"{plural}.{group}" if group else plural


def _details(name: str, group: str, kind: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    return details


def not_found(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        404,
        f'{group_resource(group, plural)} "{name}" not found',
        details=_details(name, group, plural),
    )


def already_exists(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        409,
        f'{group_resource(group, plural)} "{name}" already exists',
        reason="AlreadyExists",
        details=_details(name, group, plural),
    )


def conflict(group: str, plural: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {group_resource(group, plural)} "{name}": {why}',
        reason="Conflict",
        details=_details(name, group, plural),
    )


STALE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def invalid(group: str, kind: str, name: str, causes: Sequence[tuple[str, str, str]]) -> ApiError:
    """422 with one cause per (field, reason, message), worded like the real server."""
    texts = [f"{field}: {message}" if field else message for field, _, message in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    qualified = f"{kind}.{group}" if group else kind
    details = _details(name, group, kind)
    details["causes"] = [
        {"reason": reason, "message": message, "field": field} for field, reason, message in causes
    ]
    return ApiError(422, f'{qualified} "{name}" is invalid: {joined}', details=details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def gone(message: str) -> ApiError:
    return ApiError(410, message, reason="Expired")


def method_not_allowed(what: str) -> ApiError:
    return ApiError(405, f"{what} is not supported", reason="MethodNotAllowed")


def unsupported_media_type(content_type: str, accepted: Sequence[str]) -> ApiError:
    return ApiError(
        415,
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(accepted)}",
        reason="UnsupportedMediaType",
    )
