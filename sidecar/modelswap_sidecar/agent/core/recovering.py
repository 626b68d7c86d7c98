"""Recovering: loading models again — a reload from the source (its files changed), a
dropped model whose reload stalled, models whose runtime processes are gone, every model
after a Triton restart."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from modelswap_api.control import ActionResult
from modelswap_sidecar.agent.core import lifecycle
from modelswap_sidecar.agent.core.holds import Holds, Reload
from modelswap_sidecar.agent.core.isolation import each_record
from modelswap_sidecar.agent.core.placing import Placing
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.core.reload_drain import RELOAD
from modelswap_sidecar.agent.core.swapping import RELOAD_TIMED_OUT, Swapping
from modelswap_sidecar.agent.core.workplace import Workplace
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.load_order import load_order
from modelswap_sidecar.triton.errors import TritonError

log = logging.getLogger(__name__)


class Recovering:
    def __init__(
        self,
        w: Workplace,
        holds: Holds,
        swapping: Swapping,
        placing: Placing,
        *,
        reload_timeout_seconds: float,
    ) -> None:
        self.w = w
        self.holds = holds
        self.swapping = swapping
        self.placing = placing
        #: How long a dropped model swapped in may wait for the request that loads its
        #: weights before it is dropped again (`end_stalled_reloads`).
        self.reload_timeout_seconds = reload_timeout_seconds
        #: by UID: why the agent ended the model's runtime process (`agent/core/
        #: unresponsive.py`), said when the model is loaded again (`ProcessUnresponsive`)
        self.ended_runtimes: dict[str, str] = {}

    async def reload(self, model: AgentModel, *, keep_host_copy: bool, why: str) -> ActionResult:
        """Load the model again from its source (local mode: its files changed). It drains
        first, as a swap-out does (`reload_drain`): new requests are held (queued in the
        gateway, served once it is loaded again) and those in flight are waited for, at
        most `policy.drainTimeoutSeconds`, then ended (503 `DrainDeadline`). Then out of
        Triton (its processes exit; the engine keeps the host copy), the host copy
        dropped unless `keep_host_copy` (a kept copy is restored on attach, and the client
        binds it only while its layout fingerprint matches), then pending: placed and
        loaded as any model (`reconcile`, now). A failed model is retried at once.
        `unchanged` for a model that holds nothing to reload: not loaded yet (its load
        reads the files), or dropped (its next swap-in does).

        One reload per model at a time: one asked while another is under way (draining
        or unloading) joins it and is answered with its outcome; one asking to drop the
        host copy makes it drop it, unless it already kept it (then it runs after)."""
        while (under_way := self.holds.reloads.get(model.uid)) is not None:
            if under_way.takes(keep_host_copy):
                under_way.keep_host_copy = under_way.keep_host_copy and keep_host_copy
                result = await asyncio.shield(under_way.done)
                joined = f"joined the reload under way: {result.message or result.reason}"
                return ActionResult(
                    uid=result.uid, outcome=result.outcome, reason=result.reason, message=joined
                )
            await asyncio.shield(under_way.done)
        under_way = Reload(keep_host_copy, asyncio.get_running_loop().create_future())
        self.holds.reloads[model.uid] = under_way
        # its own task: a caller that goes away (the control API's client) cancels only
        # its wait, never a reload that others joined or a drain half done
        self.w.spawn(self._run_reload(model, under_way, why), f"reload-{model.uid}")
        return await asyncio.shield(under_way.done)

    async def _run_reload(self, model: AgentModel, under_way: Reload, why: str) -> None:
        try:
            under_way.done.set_result(await self._reload(model, under_way, why))
        except asyncio.CancelledError:  # the agent is stopping
            under_way.done.set_result(
                ActionResult(
                    uid=model.uid,
                    outcome="refused",
                    reason="ReloadInterrupted",
                    message="the agent is stopping",
                )
            )
            raise
        except Exception as e:
            under_way.done.set_exception(e)
        finally:
            under_way.holding = False
            del self.holds.reloads[model.uid]
            self.w.notify()  # requests it held look again

    async def _reload(self, model: AgentModel, under_way: Reload, why: str) -> ActionResult:
        async with self.w.lock_of(model.uid):
            if model.serving in (Serving.PENDING, Serving.DEFERRED, Serving.LOADING):
                return ActionResult(
                    uid=model.uid,
                    outcome="unchanged",
                    reason=str(model.serving),
                    message="not loaded yet: its load reads the source as it is now",
                )
            if model.serving is Serving.DROPPED:
                return ActionResult(
                    uid=model.uid,
                    outcome="unchanged",
                    reason=str(model.serving),
                    message="unloaded: its next swap-in loads it from the source",
                )
            if model.serving not in (Serving.LOADED, Serving.FAILED):
                return ActionResult(uid=model.uid, outcome="refused", reason=str(model.serving))
            if model.serving is Serving.LOADED:
                under_way.holding = True
                await self.holds.drain(model, RELOAD)
                under_way.unloading = True
                self.w.notify()  # a client's own swap-in waiting on it is refused now
                try:
                    await self.w.loader.unload(model)
                except TritonError as e:
                    return ActionResult(
                        uid=model.uid, outcome="refused", reason="UnloadFailed", message=str(e)
                    )
            under_way.decided = True
            keep_host_copy = under_way.keep_host_copy
            if not keep_host_copy:
                with contextlib.suppress(UnknownModel):
                    await asyncio.to_thread(self.w.engine.remove_model, model.triton_name)
            model.failed_at_seconds = None
            kept = "host copy kept" if keep_host_copy else "host copy dropped"
            self._mark_for_reload(model, "Reloading", f"{why} ({kept})")
            model.message = f"{why}; loading it again ({kept})"
        # placed (LOADING) before the hold ends, so held requests wait for that load
        self.placing.reconcile(order=[model])
        under_way.holding = False
        self.w.notify()
        log.info("model %s: %s; loading it again (%s)", model.uid, why, kept)
        return ActionResult(uid=model.uid, outcome="completed", reason="Reloading")

    def end_stalled_reloads(self) -> int:
        """Drop again every dropped model swapped in (fresh memory mapped) whose weights no
        request has loaded for `reload_timeout_seconds`: a request that fails before the
        model runs (a wrong input name) loads nothing. The number started."""
        now = self.w.clock()
        return sum(
            each_record(
                self.w.records.values(), "end a stalled reload of", lambda m: self._stalled(m, now)
            )
        )

    def _stalled(self, model: AgentModel, now: float) -> int:
        since = model.resident_since_seconds
        if (
            model.serving is not Serving.LOADED
            or not model.attaches
            or model.dev  # its process loads its bytes when it chooses
            or since is None
            or now - since < self.reload_timeout_seconds
            or self.w.busy(model.uid)
            or self.w.engine_state(model) is not EngineState.LOADING
            or self.w.instances(model) == 0
        ):
            return 0
        self.w.spawn(self._drop_stalled(model), f"drop-stalled-{model.uid}")
        return 1

    async def _drop_stalled(self, model: AgentModel) -> None:
        before = model.reason, model.message
        # set first: the status shows the engine's Dropped as soon as the swap-out ends
        model.reason = RELOAD_TIMED_OUT
        model.message = (
            f"swapped in after a drop, but no request loaded its weights within "
            f"{self.reload_timeout_seconds:g} s (triton.loadTimeoutSeconds; a request that "
            "fails before the model runs, such as one with a wrong input name, loads "
            "nothing): dropped again, its memory released; the next request reloads it"
        )
        result = await self.swapping.swap_out(model, reason=RELOAD_TIMED_OUT)
        if result.outcome != "completed":
            model.reason, model.message = before
            log.info("model %s: stalled reload not ended: %s", model.uid, result.reason)
            return
        log.warning("model %s: %s", model.uid, model.message)

    def reload_gone(self) -> int:
        """Load again every loaded model whose runtime processes are all gone (killed, or
        crashed): the engine saw their sockets close and kept the host copies. Call only
        while Triton answers. The number marked."""
        return sum(each_record(self.w.records.values(), "reload", self._reload_if_gone))

    def _reload_if_gone(self, model: AgentModel) -> int:
        if (
            model.serving is not Serving.LOADED
            or not model.attaches
            or model.dev  # no runtime process to load: the developer's comes and goes
            or self.w.busy(model.uid)
            or self.w.engine_state(model) is None
            or self.w.instances(model) > 0
        ):
            return 0
        ended = self.ended_runtimes.pop(model.uid, None)
        why = ended or f"its runtime process exited: {self.w.engine_reason(model)}"
        reason = "ProcessUnresponsive" if ended else "ProcessExited"
        self.w.spawn(self._unload_gone(model, why, reason), f"unload-gone-{model.uid}")
        return 1

    async def _unload_gone(self, model: AgentModel, why: str, reason: str) -> None:
        """Out of Triton first (it would take a load of a model it still lists as a no-op,
        its dead process unreplaced), then pending: placed and loaded again. The unload is
        waited for briefly only: one that holds a request the dead process had in flight
        never ends, and Triton loads the model again beside it (issue 26, item 5)."""
        async with self.w.lock_of(model.uid):
            if model.serving is not Serving.LOADED:
                return
            try:
                await self.w.loader.unload_dead(model)
            except TritonError as e:
                log.warning("model %s: unloading its dead runtime failed: %s", model.uid, e)
            self._mark_for_reload(model, reason, why)
        self.w.notify()

    def reload_all(self) -> int:
        """Triton restarted: load again every model it served (from the host store; stubs
        restore), placed one by one as the HBM budget allows (`reconcile`: the policy picks
        victims, the rest wait and are placed on later ticks) in `_reload_order`, so a
        pinned model is never the one left without room. The number marked."""
        order = self._reload_order()
        marked = sum(each_record(order, "reload", self._reload_one))
        self.placing.reconcile(order=order)
        return marked

    def _reload_order(self) -> list[AgentModel]:
        """The policy's `load_order` (pinned first, then by priority, highest first); among
        equals, models that were swapped out first and those that were resident last (each
        load maps the model, its attach restores it, and the last ones placed stay
        resident), then by uid (the records' order is the order they were pushed in)."""
        by_residency = sorted(
            self.w.records.values(), key=lambda m: (m.resident_since_seconds is not None, m.uid)
        )
        return load_order(by_residency, lambda m: m.policy)

    def _reload_one(self, model: AgentModel) -> int:
        if model.serving is Serving.FAILED:
            model.failed_at_seconds = None  # it may have failed against the dead Triton
        if (
            model.desired
            and model.serving is Serving.LOADED
            and not model.dev  # not in Triton: its process is the developer's
            and not self.w.busy(model.uid)
        ):
            return self._mark_for_reload(model, "Reloading", "Triton restarted")
        return 0

    def _mark_for_reload(self, model: AgentModel, reason: str, message: str) -> int:
        """Pending again (not charged to any GPU): the policy loop places and loads it."""
        lifecycle.load_again(model, reason, message)
        return 1
