"""What the actuator's parts share (`Actuator` builds one and hands it to each): the records
table, the engine, the loader, the policy, the clocks and the metrics; per-model locks;
the change signal waiters wait on; background tasks; the node view decisions read; and the
one load step every load goes through (`load_locked`).

Every operation on one model holds that model's lock (`lock_of`), so a policy swap-out, a
manual swap-in and an unload never overlap; the loops skip a model whose lock is held.
Waiters (admission that must wait, the gateway waiting for a load) wait on `changed()`,
which every swap, load and unload sets (`notify`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from modelswap_api.models import Link
from modelswap_sidecar.agent.core import lifecycle
from modelswap_sidecar.agent.core.loading import ModelLoader
from modelswap_sidecar.agent.core.records import AgentModel, user_name_of
from modelswap_sidecar.agent.core.views import GpuBudget, node_view
from modelswap_sidecar.agent.errors import LoadError
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.metrics import ModelLabels, NodeMetrics
from modelswap_sidecar.policy.facade import Policy
from modelswap_sidecar.policy.inputs import NodeView

log = logging.getLogger(__name__)

Clock = Callable[[], float]
#: The longest a waiter sleeps between looks when nothing is signalled (a safety net: every
#: swap, load and unload signals `changed`).
_LOOK_AGAIN_SECONDS = 1.0
#: A GPU's host-to-device bandwidth for scoring when its link was not measured.
UNMEASURED_LINK_BYTES_PER_SECOND = 10e9


def link_bytes_per_second(link: Link | None) -> float:
    """The measured host-to-device bandwidth of `link` (GB/s → bytes/s), else the default."""
    gbps = link.host_to_device_gbps if link is not None else None
    return gbps * 1e9 if gbps else UNMEASURED_LINK_BYTES_PER_SECOND


def labels_of(model: AgentModel) -> ModelLabels:
    """Its metric labels: `model` is the name users call, as the gateway's series carry it."""
    return ModelLabels(
        uid=model.uid, namespace=model.entry.namespace, name=user_name_of(model.entry)
    )


class Workplace:
    def __init__(
        self,
        *,
        engine: Engine,
        loader: ModelLoader,
        policy: Policy,
        gpu_uuids: tuple[str, ...],
        metrics: NodeMetrics | None,
        records: dict[str, AgentModel],
        links: Sequence[Link],
        clock: Clock,
        wall_clock: Clock,
    ) -> None:
        self.engine = engine
        self.loader = loader
        self.policy = policy
        self.gpu_uuids = gpu_uuids
        self.metrics = metrics
        self.clock = clock
        self.wall_clock = wall_clock
        #: by UID
        self.records = records
        #: per GPU ordinal: what the policy scores a swap-in's cost with
        self.link_bytes_per_second = tuple(
            link_bytes_per_second(links[i] if i < len(links) else None)
            for i in range(len(gpu_uuids))
        )
        #: the loop the engine's swap events and clients' swap-ins are handed to
        #: (`Swapping.listen`)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()

    def notify(self) -> None:
        """Something waiters may wait for happened (a swap, a load, an unload)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout_seconds: float) -> None:
        """Return at the next `notify`, or after `timeout_seconds` (at most a second)."""
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), min(timeout_seconds, _LOOK_AGAIN_SECONDS))

    def lock_of(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())

    def busy(self, uid: str) -> bool:
        return self.lock_of(uid).locked()

    def ordinal_of(self, uuid: str) -> int:
        return self.gpu_uuids.index(uuid)

    def gpu_budgets(self) -> list[GpuBudget]:
        return [
            GpuBudget(
                ordinal=i,
                uuid=u,
                budget_bytes=self.engine.budget(i).budget_bytes,
                host_to_device_bytes_per_second=self.link_bytes_per_second[i],
            )
            for i, u in enumerate(self.gpu_uuids)
        ]

    def engine_states(self) -> dict[str, EngineState]:
        return {s.name: s.state for s in self.engine.statuses()}

    def view(self) -> NodeView:
        return node_view(
            list(self.records.values()), self.engine_states(), self.gpu_budgets(), self.clock()
        )

    def engine_state(self, model: AgentModel) -> EngineState | None:
        try:
            return self.engine.state(model.triton_name)
        except UnknownModel:
            return None

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _load_unnotified(self, model: AgentModel) -> None:
        started = self.clock()
        try:
            await self.loader.load(model)
        except LoadError as e:
            log.warning("model %s (%s): %s", model.uid, model.entry.name, e.message)
            lifecycle.fail(model, e.reason, e.message, self.clock())
            return
        lifecycle.loaded(model, self.clock())
        if self.metrics is not None:
            self.metrics.observe_load(labels_of(model), self.clock() - started)
        log.info(
            "model %s/%s (uid %s) serving on GPU %s",
            model.entry.namespace,
            model.entry.name,
            model.uid,
            model.gpu,
        )

    def instances(self, model: AgentModel) -> int:
        """Live instances of the model the engine counts (0: none, or not in the engine)."""
        try:
            return self.engine.status(model.triton_name).instances
        except UnknownModel:
            return 0

    def engine_reason(self, model: AgentModel) -> str:
        """The engine's reason for the model's state ("": not in the engine)."""
        try:
            return self.engine.status(model.triton_name).reason
        except UnknownModel:
            return ""

    def idle_seconds(self, model: AgentModel) -> float:
        """Seconds since its last request or since it became resident, the later."""
        marks = [t for t in (model.last_request_seconds, model.resident_since_seconds) if t]
        return max(self.clock() - max(marks), 0.0) if marks else 0.0

    async def load_locked(self, model: AgentModel) -> None:
        """One load through the loader, the model's lock held by the caller (a placed load,
        a dropped model's swap-in): loaded or failed (`lifecycle`), then waiters told."""
        try:
            await self._load_unnotified(model)
        finally:
            self.notify()
