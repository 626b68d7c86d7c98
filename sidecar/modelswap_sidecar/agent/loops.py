"""The agent's two loops.

Policy loop (every `interval_seconds`):
1. read Triton's statistics: a model's `last_inference` is its last request (traffic that
   bypasses the gateway counts too);
2. note engine state changes: when a model became resident (for `minResident`), and swaps
   the engine did by itself (a request-driven swap-in, an eviction to make room) for the
   metrics;
3. ask the policy for swap-outs (idle past `idleAfter`, relief above the high watermark;
   never a pinned model) and start them;
4. place and load what waits (pending, deferred, failed and due for a retry).

Runtime watch (same interval): the current Triton's pid (from the pid source). A new pid
means Triton restarted (readiness cannot say so: with `--strict-readiness` the server is
not ready while a model loads): its stubs are
gone (the engine saw their sockets close and keeps every host copy), so every model it
served is loaded again and restored from the host store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from modelswap_sidecar.agent.actuator import Actuator, labels_of
from modelswap_sidecar.agent.isolation import each_record
from modelswap_sidecar.agent.records import AgentModel, Serving
from modelswap_sidecar.engine.core import ModelStatus
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.metrics import NodeMetrics
from modelswap_sidecar.triton.driver import ModelStatistics, TritonDriver
from modelswap_sidecar.triton.errors import TritonError

log = logging.getLogger(__name__)


class PolicyLoop:
    def __init__(
        self,
        actuator: Actuator,
        driver: TritonDriver,
        *,
        interval_seconds: float,
        metrics: NodeMetrics | None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.actuator = actuator
        self.driver = driver
        self.interval_seconds = interval_seconds
        self.metrics = metrics
        self.wall_clock = wall_clock
        self._last_inference: dict[str, float] = {}

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("policy tick failed")
            await asyncio.sleep(self.interval_seconds)

    async def tick(self) -> None:
        try:
            stats = await self.driver.all_statistics()
        except TritonError as e:
            log.debug("no Triton statistics this tick: %s", e)
            stats = {}
        self.observe_requests(stats)
        self.observe_engine()
        act = self.actuator
        for decision in act.policy.swap_outs(act.view()):
            model = act.records.get(decision.uid)
            if model is None or act.busy(decision.uid):
                continue
            act.spawn(
                self._swap_out(decision.uid, str(decision.reason)),
                f"swap-out-{decision.uid}",
            )
        act.reconcile()

    async def _swap_out(self, uid: str, reason: str) -> None:
        result = await self.actuator.swap_out_uid(uid, reason=reason)
        if result.outcome == "refused":
            log.info("policy swap-out of %s refused: %s %s", uid, result.reason, result.message)

    def observe_requests(self, stats: dict[str, ModelStatistics]) -> None:
        now, wall = self.actuator.clock(), self.wall_clock()
        for uid, s in stats.items():
            model = self.actuator.records.get(uid)
            last = s.last_inference_seconds
            if model is None or last is None or self._last_inference.get(uid) == last:
                continue
            self._last_inference[uid] = last
            model.last_request_wall_seconds = last
            model.last_request_seconds = now - max(wall - last, 0.0)

    def observe_engine(self) -> None:
        """Per model (one at a time: a fault stays that model's, `isolation`)."""
        states = {s.name: s for s in self.actuator.engine.statuses()}
        now = self.actuator.clock()
        each_record(
            self.actuator.records.values(),
            "observe the engine state of",
            lambda model: self._observe(model, states, now),
        )

    def _observe(self, model: AgentModel, states: dict[str, ModelStatus], now: float) -> None:
        act = self.actuator
        status = states.get(model.triton_name)
        if status is None or model.serving is not Serving.LOADED:
            return
        if status.state is EngineState.RESIDENT and model.engine_state != status.state:
            model.resident_since_seconds = now
        model.engine_state = str(status.state)
        # swaps the engine did by itself (request-driven swap-ins, make-room evictions)
        if status.swap_ins > model.swap_ins:
            if self.metrics is not None and model.gpu is not None:
                self.metrics.observe_swap_in(
                    labels_of(model),
                    act.gpu_uuids[model.gpu],
                    status.last_swap_in_seconds,
                    model.weights_bytes,
                )
            model.swap_ins = status.swap_ins
        if status.swap_outs > model.swap_outs:
            if self.metrics is not None and model.gpu is not None:
                self.metrics.observe_swap_out(
                    labels_of(model),
                    act.gpu_uuids[model.gpu],
                    reason="MakeRoom",
                    seconds=0.0,
                    bytes_moved=0,
                    idle_seconds=0.0,
                )
            model.swap_outs = status.swap_outs


class RuntimeWatch:
    def __init__(
        self,
        actuator: Actuator,
        driver: TritonDriver,
        pid_source: Callable[[], int | None],
        *,
        interval_seconds: float,
        metrics: NodeMetrics | None,
    ) -> None:
        self.actuator = actuator
        self.driver = driver
        self.pid_source = pid_source
        self.interval_seconds = interval_seconds
        self.metrics = metrics
        self._pid: int | None = None
        self._ready = False
        self._restart_pending = False
        self.restarts = 0
        #: Set once Triton has been seen ready (the assembly waits on it to adopt models).
        self.first_ready = asyncio.Event()

    async def run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:
                log.exception("runtime check failed")
            await asyncio.sleep(self.interval_seconds)

    async def check(self) -> None:
        pid = self.pid_source()
        ready = await self.driver.server_ready()
        if pid is not None and self._pid is not None and pid != self._pid:
            log.warning("Triton restarted: pid %d -> %d", self._pid, pid)
            self._restart_pending = True
        if pid is not None:
            self._pid = pid
        if not ready:
            self._ready = False
            return
        if self._restart_pending:
            self._restart_pending = False
            self.restarts += 1
            if self.metrics is not None:
                self.metrics.triton_restarts.inc()
            count = self.actuator.reload_all()
            log.info("reloading %d model(s) into the restarted Triton", count)
        self._ready = True
        self.first_ready.set()
