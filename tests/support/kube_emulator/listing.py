"""List responses: kind/apiVersion, the list resourceVersion, limit/continue paging."""

from __future__ import annotations

import base64
import json
from typing import Any

from tests.support.kube_emulator.errors import ApiError
from tests.support.kube_emulator.resources import ResourceType


def _encode(rv: str, after: tuple[str, str]) -> str:
    raw = json.dumps({"rv": rv, "after": list(after)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode(token: str) -> tuple[str, tuple[str, str]]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(data["rv"]), (data["after"][0], data["after"][1])
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise ApiError(400, f"continue key is not valid: {e}") from e


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def page(
    items: list[dict[str, Any]], rv: str, limit: str | None, continue_token: str | None
) -> tuple[list[dict[str, Any]], str | None, int | None]:
    """The page of `items`, the next continue token and the count after it (etcd's order)."""
    if continue_token:
        rv, after = _decode(continue_token)
        items = [obj for obj in items if _key(obj) > after]
    if not limit or int(limit) <= 0 or len(items) <= int(limit):
        return items, None, None
    cut = int(limit)
    return items[:cut], _encode(rv, _key(items[cut - 1])), len(items) - cut


def list_body(
    rt: ResourceType,
    items: list[dict[str, Any]],
    rv: str,
    continue_token: str | None,
    remaining: int | None,
) -> dict[str, Any]:
    if not rt.custom:  # built-in lists carry kind/apiVersion on the list, not on items
        items = [{k: v for k, v in obj.items() if k not in ("kind", "apiVersion")} for obj in items]
    metadata: dict[str, Any] = {"resourceVersion": rv}
    if continue_token:
        metadata["continue"] = continue_token
        metadata["remainingItemCount"] = remaining
    return {
        "kind": rt.list_kind,
        "apiVersion": rt.api_version,
        "metadata": metadata,
        "items": items,
    }
