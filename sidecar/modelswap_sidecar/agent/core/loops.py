"""The agent's two loops.

Policy loop (every `interval_seconds`):
1. read Triton's statistics: a model's `last_inference` is its last request (traffic that
   bypasses the gateway counts too);
2. ask the policy for swap-outs (idle past `idleAfter`, relief above the high watermark;
   never a pinned model) and start them;
3. place and load what waits (pending, deferred, failed and due for a retry), unless the
   control service's fencing holds (`may_load_new`): then each is deferred, `Fenced`.

A dev model's idle clock (local mode's dev loop) starts once its process has committed
(`Actuator.start_dev_clocks`): the policy sees its requests nowhere, so it idles from then,
or from its last swap-in.

Before those, while Triton answers: a loaded model whose runtime processes have all exited
(killed, crashed) is made pending again, so step 3 loads it again (its stub restores from
the host store); a dropped model swapped in whose weights no request has loaded within the
reload timeout is dropped again (`Actuator.end_stalled_reloads`).

Swaps are recorded where they happen (`Actuator._on_swap`, from the engine's events), not
here.

Runtime watch (same interval): the current Triton's pid (from the pid source). A new pid
means Triton restarted (readiness cannot say so: with `--strict-readiness` the server is
not ready while a model loads): its stubs are
gone (the engine saw their sockets close and keeps every host copy), so every model it
served is made pending and placed again, one by one as the HBM budget allows (the policy
chooses victims; what does not fit yet waits for the next tick), each restored from the
host store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from modelswap_sidecar.agent.core.actuator import Actuator
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
        may_load_new: Callable[[], bool] = lambda: True,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`may_load_new`: False while the control service's fencing holds (nothing new is
        placed: waiting models are deferred, reason `Fenced`)."""
        self.actuator = actuator
        self.driver = driver
        self.interval_seconds = interval_seconds
        self.metrics = metrics
        self.may_load_new = may_load_new
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
        act = self.actuator
        try:
            stats = await self.driver.all_statistics()
        except TritonError as e:
            log.debug("no Triton statistics this tick: %s", e)
            stats = {}
        else:  # Triton answers: a model whose processes are all gone is loaded again
            gone = act.reload_gone()
            if gone:
                log.warning("loading %d model(s) again: their runtime processes exited", gone)
        self.observe_requests(stats)
        act.start_dev_clocks()
        act.end_stalled_reloads()
        for decision in act.policy.swap_outs(act.view()):
            model = act.records.get(decision.uid)
            if model is None or act.busy(decision.uid):
                continue
            act.spawn(
                self._swap_out(decision.uid, str(decision.reason)),
                f"swap-out-{decision.uid}",
            )
        act.reconcile(fenced=not self.may_load_new())

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
            # the gateway may have seen a later request or answer: a mark never goes back
            model.request_arrived(last, now_seconds=now, wall_now_seconds=wall)


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
        #: Set once Triton has been seen ready (`adoption.adopt` waits on it).
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
