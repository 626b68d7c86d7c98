"""Kubernetes Events about ModelDeployments (what `kubectl describe md` shows).

An Event is posted once per (object, reason, message): the loop recomputes every status
each turn and must not repeat itself. Posting is best effort: a failed post is logged,
never retried, never allowed to hold up the loop's other work.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from modelswap_api import kube
from modelswap_operator.kubeio import KubeIO

log = logging.getLogger(__name__)
COMPONENT = "modelswap-operator"
#: Remembered (object, reason, message) triples; the oldest are dropped past this.
_MEMORY = 20_000


def event_body(
    involved: Mapping[str, Any], kind: str, reason: str, message: str, now: datetime
) -> dict[str, Any]:
    metadata = involved["metadata"]
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
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


class EventRecorder:
    def __init__(self, io: KubeIO) -> None:
        self.io = io
        self._posted: dict[tuple[str, str, str], None] = {}

    async def post(self, involved: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        key = (involved["metadata"]["uid"], reason, message)
        if key in self._posted:
            return
        self._posted[key] = None
        if len(self._posted) > _MEMORY:
            self._posted.pop(next(iter(self._posted)))
        body = event_body(involved, kind, reason, message, datetime.now(UTC))
        try:
            await self.io.call(kube.create_event, involved["metadata"]["namespace"], body)
        except kube.KubeError as e:
            log.warning("could not post Event %s for %s: %s", reason, key[0], e)
