"""Writing each ModelDeployment's status when it changed (one patch per object per turn),
with an Event (a new one, or a bump of its series: `events`) for every condition that
changed. `StatusWriter` owns the memo of the statuses it wrote and what it built them
from: the same inputs over the same status build the same status again (nothing to
write, nothing to build)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from typing import Any

from modelswap_api import kube
from modelswap_operator.cache import Body, Snapshot
from modelswap_operator.events import EventRecorder
from modelswap_operator.kubeio import KubeIO
from modelswap_operator.metrics import OperatorMetrics
from modelswap_operator.status import Observed, Verdict
from modelswap_operator.turn_plan import StatusPatch, plan_statuses

log = logging.getLogger(__name__)


class StatusWriter:
    def __init__(self, *, io: KubeIO, events: EventRecorder, metrics: OperatorMetrics) -> None:
        self.io = io
        self.events = events
        self.metrics = metrics
        #: Per uid: the status this process last wrote (the watch may not have brought it).
        self._statuses: dict[str, dict[str, Any]] = {}
        #: Per uid: the inputs of the status last built and the status then in effect.
        self._inputs: dict[str, tuple[Any, Mapping[str, Any] | None]] = {}

    @property
    def written(self) -> Mapping[str, Mapping[str, Any]]:
        """The status this process last wrote, by uid."""
        return self._statuses

    def latest(self, uid: str, body: Body | None) -> Mapping[str, Any] | None:
        """The status in effect: the one last written, else the body's."""
        return self._statuses.get(uid) or (body or {}).get("status")

    def keep(self, uids: Collection[str]) -> None:
        """Forget the models no longer known."""
        for uid in set(self._statuses) - set(uids):
            del self._statuses[uid]
        for uid in set(self._inputs) - set(uids):
            del self._inputs[uid]

    async def write_all(
        self,
        snap: Snapshot,
        verdicts: Mapping[str, Verdict],
        observed: Mapping[str, Observed],
        routed: Mapping[str, tuple[bool, str | None]],
        *,
        released: Collection[str],
        stamp: str,
        limit: int,
    ) -> None:
        """Each changed status is written (`turn_plan.plan_statuses`: one patch per object,
        then its Events), side by side, `limit` at once."""
        plan = plan_statuses(snap.deployments, verdicts, observed, routed, written=self._statuses,
                             built_from=self._inputs, released=released, stamp=stamp)  # fmt: skip
        self._inputs.update(plan.unchanged)
        semaphore = asyncio.Semaphore(limit)
        await asyncio.gather(*(self._write(patch, semaphore) for patch in plan.writes))

    async def _write(self, patch: StatusPatch, semaphore: asyncio.Semaphore) -> None:
        metadata = patch.body["metadata"]
        namespace, name = str(metadata.get("namespace") or ""), str(metadata["name"])
        async with semaphore:
            try:
                await self.io.call(
                    kube.patch_model_deployment_status, namespace, name, {"status": patch.patch}
                )
            except kube.NotFound:
                return
            except kube.KubeError as e:
                self.metrics.status_writes.labels("failed").inc()
                log.warning("status of %s/%s: %s", namespace, name, e)
                return
            self.metrics.status_writes.labels("ok").inc()
            self._statuses[patch.uid] = patch.status
            self._inputs[patch.uid] = (patch.inputs, patch.status)
            for note in patch.events:
                await self.events.post(patch.body, note.type, note.reason, note.message)
