"""Kubernetes Events about ModelDeployments (what `kubectl describe md` shows).

Every transition the loop reports is recorded, with the series semantics of core v1 Events
that client-go's recorder (kubelet, the controllers) uses: the first occurrence of an
(object, type, reason, message) creates an Event with `count` 1; each later occurrence
bumps that Event's `count` and `lastTimestamp` (a merge patch), so `kubectl describe`
shows "x3 over 5m" and the newest occurrence, never a stale one. An Event the API server
has expired (its event TTL, an hour by default) answers NotFound to the bump: a new Event
starts the series again. The caller decides what is a transition (`status.events_between`);
the recorder never drops one.

Posting is best effort: a failed post is logged, never retried, never allowed to hold up
the loop's other work (the series then continues from what was last written).

A terminating namespace refuses every new object, Events included (403 Forbidden,
`NamespaceTerminating`: "unable to create new content in namespace ... because it is being
terminated"). Deleting a namespace of many models would otherwise cost a refused post and
a warning line for each of their last transitions: the first refusal marks the namespace
(one INFO line), and for `TERMINATING_QUIET_SECONDS` no Event is posted or bumped there
(a namespace created again under the same name gets its Events after that). The Events
of models being deleted are posted one at a time per namespace, so that one refusal is
all a terminating namespace sees.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from modelswap_api import kube
from modelswap_operator.kubeio import KubeIO

log = logging.getLogger(__name__)
COMPONENT = "modelswap-operator"
#: Series remembered (the least recently bumped are forgotten past this: their next
#: occurrence starts a new Event, as after an operator restart).
MEMORY = 20_000
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

#: How long a namespace that refused an Event as terminating gets no more posts.
TERMINATING_QUIET_SECONDS = 300.0

SeriesKey = tuple[str, str, str, str]  # involved uid, type, reason, message


def namespace_terminating(error: kube.KubeError) -> bool:
    """The API server refused a create because the namespace is being deleted (its
    Status' cause NamespaceTerminating, or the message it carries)."""
    text = str(error)
    return error.status == 403 and (
        "NamespaceTerminating" in text or "because it is being terminated" in text
    )


def event_body(
    involved: Mapping[str, Any], kind: str, reason: str, message: str, now: datetime
) -> dict[str, Any]:
    """The first Event of a series (`count` 1)."""
    metadata = involved["metadata"]
    stamp = now.strftime(_TIME_FORMAT)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{metadata['name']}.{uuid.uuid4().hex[:16]}",
            "namespace": metadata["namespace"],
        },
        "involvedObject": {
            "apiVersion": involved["apiVersion"],
            "kind": involved["kind"],
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata["uid"],
        },
        "type": kind,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def bump(count: int, now: datetime) -> dict[str, Any]:
    """The merge patch that records one more occurrence of a series now at `count`."""
    return {"count": count + 1, "lastTimestamp": now.strftime(_TIME_FORMAT)}


@dataclass
class _Series:
    name: str
    count: int


class EventRecorder:
    def __init__(self, io: KubeIO, *, clock: Callable[[], datetime] | None = None) -> None:
        self.io = io
        self._clock = clock or (lambda: datetime.now(UTC))
        self._series: OrderedDict[SeriesKey, _Series] = OrderedDict()
        #: Namespaces that refused an Event as terminating, and since when.
        self._terminating: dict[str, datetime] = {}
        self._deleting_locks: dict[str, asyncio.Lock] = {}

    def terminating(self, namespace: str) -> bool:
        """The namespace refused an Event as terminating in the last
        `TERMINATING_QUIET_SECONDS`: nothing more is posted there."""
        since = self._terminating.get(namespace)
        if since is None:
            return False
        if (self._clock() - since).total_seconds() < TERMINATING_QUIET_SECONDS:
            return True
        del self._terminating[namespace]
        return False

    def _refused_as_terminating(self, namespace: str, error: kube.KubeError) -> bool:
        if not namespace_terminating(error):
            return False
        if namespace not in self._terminating:
            log.info("namespace %s is being deleted: no more Events there", namespace)
        self._terminating[namespace] = self._clock()
        return True

    async def post(self, involved: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """Record one occurrence: bump the series' Event, or create it."""
        namespace = str(involved["metadata"]["namespace"])
        if not involved["metadata"].get("deletionTimestamp"):
            await self._post(involved, kind, reason, message)
            return
        # Every model of a terminating namespace is being deleted, and the loop posts their
        # Events side by side: one at a time per namespace, so that the first refusal
        # stops the rest.
        lock = self._deleting_locks.setdefault(namespace, asyncio.Lock())
        async with lock:
            await self._post(involved, kind, reason, message)
        if not lock.locked():
            self._deleting_locks.pop(namespace, None)

    async def _post(
        self, involved: Mapping[str, Any], kind: str, reason: str, message: str
    ) -> None:
        metadata = involved["metadata"]
        namespace = str(metadata["namespace"])
        if self.terminating(namespace):
            return
        key: SeriesKey = (str(metadata["uid"]), kind, reason, message[:1024])
        now = self._clock()
        series = self._series.get(key)
        if series is not None:
            try:
                await self.io.call(
                    kube.patch_event, namespace, series.name, bump(series.count, now)
                )
            except kube.NotFound:
                del self._series[key]  # expired by the API server: a new series below
            except kube.KubeError as e:
                if not self._refused_as_terminating(namespace, e):
                    log.warning("could not bump Event %s (%s) for %s: %s", series.name,
                                reason, key[0], e)  # fmt: skip
                return
            else:
                series.count += 1
                self._series.move_to_end(key)
                return
        body = event_body(involved, kind, reason, message, now)
        try:
            await self.io.call(kube.create_event, namespace, body)
        except kube.KubeError as e:
            if not self._refused_as_terminating(namespace, e):
                log.warning("could not post Event %s for %s: %s", reason, key[0], e)
            return
        self._series[key] = _Series(name=body["metadata"]["name"], count=1)
        while len(self._series) > MEMORY:
            self._series.popitem(last=False)
