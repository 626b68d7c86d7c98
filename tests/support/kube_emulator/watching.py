"""Watch streams: initial ADDED events, resume from a resourceVersion (410 inside the 200
stream when it is too old), selector transitions (an object that starts or stops matching is
ADDED or DELETED for that watcher), BOOKMARKs, `timeoutSeconds`, and the end of the stream
when the resource type goes away."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from tests.support.kube_emulator import tables
from tests.support.kube_emulator.errors import ApiError, gone
from tests.support.kube_emulator.operations import Cluster
from tests.support.kube_emulator.resources import ResourceType
from tests.support.kube_emulator.selectors import Predicate
from tests.support.kube_emulator.store import Event, TooOldError

DEFAULT_TIMEOUT_S = 1800.0


def _line(event_type: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _translate(event: Event, predicate: Predicate) -> str | None:
    """The event type this watcher sees, or None when the change is invisible to it."""
    new_match = predicate(event.object)
    old_match = event.old is not None and predicate(event.old)
    if event.type == "ADDED":
        return "ADDED" if new_match else None
    if event.type == "DELETED":
        return "DELETED" if old_match else None
    if new_match and old_match:
        return "MODIFIED"
    if new_match:
        return "ADDED"
    return "DELETED" if old_match else None


async def stream(
    request: web.Request,
    cluster: Cluster,
    rt: ResourceType,
    namespace: str | None,
    predicate: Predicate,
    *,
    bookmark_interval_s: float,
    as_table: bool = False,
) -> web.StreamResponse:
    """Serve one watch. With `as_table` (kubectl get -w) each object is a one-row Table, with
    the column definitions in the first event only, as the real server sends them."""
    headers_sent = False

    def render(obj: dict[str, Any]) -> dict[str, Any]:
        nonlocal headers_sent
        if not as_table:
            return obj
        include = request.query.get("includeObject", "Metadata")
        rendered = tables.table(
            rt, [obj], resource_version=obj["metadata"]["resourceVersion"], include_object=include
        )
        if headers_sent:
            rendered["columnDefinitions"] = []
        headers_sent = True
        return rendered

    query = request.query
    rv = query.get("resourceVersion", "")
    send_initial = query.get("sendInitialEvents") == "true"
    bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
    try:
        timeout_s = float(query.get("timeoutSeconds") or DEFAULT_TIMEOUT_S)
    except ValueError as e:
        raise ApiError(400, f"invalid timeoutSeconds: {e}") from e
    initial: list[dict[str, Any]] = []
    since: int | None = None
    if rv in ("", "0") or send_initial:
        initial = cluster.select(rt, namespace, predicate)
    else:
        try:
            since = int(rv)
        except ValueError as e:
            raise ApiError(400, f"invalid resourceVersion {rv!r}") from e
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    try:
        watcher = cluster.store.watch(rt.key, namespace, since)
    except TooOldError as e:
        await response.prepare(request)
        await response.write(_line("ERROR", gone(str(e)).status()))
        await response.write_eof()
        return response
    try:
        await response.prepare(request)
        for obj in initial:
            await response.write(_line("ADDED", render(obj)))
        if send_initial:
            await response.write(_line("BOOKMARK", _bookmark(rt, cluster, initial_end=True)))
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            wait = min(remaining, bookmark_interval_s) if bookmarks else remaining
            try:
                event = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
            except TimeoutError:
                if bookmarks:
                    await response.write(_line("BOOKMARK", _bookmark(rt, cluster)))
                continue
            # what else is already queued goes out in the same write (one send, not one per
            # event: a burst of writes reaches a watcher as a burst of lines)
            lines: list[bytes] = []
            ended = False
            while event is not None:
                seen_as = _translate(event, predicate)
                if seen_as is not None:
                    obj = cluster.as_version(rt, dict(event.object))
                    lines.append(_line(seen_as, render(obj)))
                if watcher.queue.empty():
                    break
                event = watcher.queue.get_nowait()
            else:
                ended = True
            if lines:
                await response.write(b"".join(lines))
            if ended:
                break
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away
    finally:
        cluster.store.unwatch(watcher)
    return response


def _bookmark(rt: ResourceType, cluster: Cluster, *, initial_end: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": str(cluster.store.rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}
