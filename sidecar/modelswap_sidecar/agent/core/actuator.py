"""Side effects on models: place and load, swap out and in, drop, unload, forget, reload.

Decisions come from pure code (`placement.place`, the `Policy`); the actuator carries them
out and keeps each record's counters and times (its `serving` moves through `lifecycle`).
Engine calls block (threads and client round trips), so they run in worker threads.

The actuator is its parts, each built here with the ones it uses (constructors, no base
classes), and the names the rest of the agent calls them by:

    Workplace   workplace.py   records, engine, loader, policy, clocks, metrics; per-model
                               locks, the change signal, background tasks, the node view,
                               the one load step
    Holds       holds.py       reloads under way, drop-style swap-outs holding requests,
                               the drain before an unload from Triton
    Swapping    swapping.py    the one decider of every swap-in (clients' own included),
                               swap-outs, the record of every swap
    Placing     placing.py     placing and loading waiting models, unloading, forgetting
    Recovering  recovering.py  reloads from the source, stalled reloads, dead runtime
                               processes, a Triton restart
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from modelswap_api.models import Link
from modelswap_sidecar.agent.core.holds import Holds
from modelswap_sidecar.agent.core.loading import ModelLoader
from modelswap_sidecar.agent.core.placing import Placing
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.core.recovering import Recovering
from modelswap_sidecar.agent.core.reload_drain import ReloadDrain
from modelswap_sidecar.agent.core.swapping import (
    ADMISSION_WAIT_SECONDS,
    RELOAD_TIMED_OUT,
    UNKNOWN_TO_AGENT,
    Swapping,
)
from modelswap_sidecar.agent.core.workplace import (
    UNMEASURED_LINK_BYTES_PER_SECOND,
    Clock,
    Workplace,
    labels_of,
    link_bytes_per_second,
)
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.metrics import NodeMetrics
from modelswap_sidecar.policy.facade import Policy

__all__ = [
    "ADMISSION_WAIT_SECONDS",
    "RELOAD_TIMED_OUT",
    "UNKNOWN_TO_AGENT",
    "UNMEASURED_LINK_BYTES_PER_SECOND",
    "Actuator",
    "labels_of",
    "link_bytes_per_second",
]


class Actuator:
    def __init__(
        self,
        *,
        engine: Engine,
        loader: ModelLoader,
        policy: Policy,
        gpu_uuids: tuple[str, ...],
        metrics: NodeMetrics | None,
        records: dict[str, AgentModel] | None = None,
        links: Sequence[Link] = (),
        retry_failed_seconds: float = 60.0,
        reload_timeout_seconds: float = 600.0,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        adopting: bool = False,
    ) -> None:
        """`records` (by UID) is the table the actuator keeps; the assembly shares it with
        the metrics' sampler, which is built before the actuator. `adopting`: a previous
        agent's models are still to be taken back (`adoption_ended` says when they are)."""
        self.workplace = w = Workplace(
            engine=engine,
            loader=loader,
            policy=policy,
            gpu_uuids=gpu_uuids,
            metrics=metrics,
            records={} if records is None else records,
            links=links,
            clock=clock,
            wall_clock=wall_clock,
        )
        self.holds = holds = Holds(w)
        self.swapping = swapping = Swapping(w, holds, adopting=adopting)
        self.placing = placing = Placing(
            w, holds, swapping, retry_failed_seconds=retry_failed_seconds
        )
        self.recovering = recovering = Recovering(
            w, holds, swapping, placing, reload_timeout_seconds=reload_timeout_seconds
        )
        self.records = w.records
        self.gpu_uuids = gpu_uuids
        self.link_bytes_per_second = w.link_bytes_per_second
        self.ended_runtimes = recovering.ended_runtimes
        # -- the workplace: waiting, locks, background work, what decisions read
        self.notify = w.notify
        self.changed = w.changed
        self.lock_of = w.lock_of
        self.busy = w.busy
        self.ordinal_of = w.ordinal_of
        self.gpu_budgets = w.gpu_budgets
        self.engine_states = w.engine_states
        self.view = w.view
        self.engine_state = w.engine_state
        self.spawn = w.spawn
        self.close = w.close
        # -- holds and drains
        self.drain_reloads_with = holds.drain_reloads_with
        self.held = holds.held
        self.hold_state = holds.hold_state
        self.draining = holds.draining
        # -- swaps
        self.listen = swapping.listen
        self.adoption_ended = swapping.adoption_ended
        self.decide_client_swap_in = swapping.decide_client_swap_in
        self.swap_out_uid = swapping.swap_out_uid
        self.swap_out = swapping.swap_out
        self.swap_in = swapping.swap_in
        # -- placing, loading, unloading
        self.candidate_gpus = placing.candidate_gpus
        self.try_place = placing.try_place
        self.start_load = placing.start_load
        self.reconcile = placing.reconcile
        self.unload = placing.unload
        self.forget = placing.forget
        self.start_dev_clocks = placing.start_dev_clocks
        # -- loading again
        self.reload = recovering.reload
        self.end_stalled_reloads = recovering.end_stalled_reloads
        self.reload_gone = recovering.reload_gone
        self.reload_all = recovering.reload_all

    # Collaborators and settings a caller (or a test) may replace after the actuator is
    # built: every part reads them from the one workplace.

    @property
    def engine(self) -> Engine:
        return self.workplace.engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self.workplace.engine = engine

    @property
    def loader(self) -> ModelLoader:
        return self.workplace.loader

    @loader.setter
    def loader(self, loader: ModelLoader) -> None:
        self.workplace.loader = loader

    @property
    def policy(self) -> Policy:
        return self.workplace.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.workplace.policy = policy

    @property
    def metrics(self) -> NodeMetrics | None:
        return self.workplace.metrics

    @metrics.setter
    def metrics(self, metrics: NodeMetrics | None) -> None:
        self.workplace.metrics = metrics

    @property
    def clock(self) -> Clock:
        return self.workplace.clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        self.workplace.clock = clock

    @property
    def wall_clock(self) -> Clock:
        return self.workplace.wall_clock

    @property
    def reload_drain(self) -> ReloadDrain | None:
        return self.holds.reload_drain

    @reload_drain.setter
    def reload_drain(self, reload_drain: ReloadDrain | None) -> None:
        self.holds.reload_drain = reload_drain

    @property
    def adopting(self) -> bool:
        return self.swapping.adopting

    @property
    def retry_failed_seconds(self) -> float:
        return self.placing.retry_failed_seconds

    @property
    def reload_timeout_seconds(self) -> float:
        return self.recovering.reload_timeout_seconds
