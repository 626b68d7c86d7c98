"""Placing every live ModelDeployment over the live SwapNodes (`planner.plan_views`, pure),
keeping each model where its status (or the previous turn) put it unless it must move.
`Placer` owns the memo of the last placements and of the last plan with its inputs: an
idle turn (every input as before) plans nothing."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelswap_api.errors import ContractError
from modelswap_api.models import ModelDeployment, SwapNode
from modelswap_operator import planner
from modelswap_operator.cache import Body
from modelswap_operator.metrics import OperatorMetrics
from modelswap_operator.planning.eligibility import NodeView, node_views
from modelswap_operator.reading import ReadOnce, read_swapnode
from modelswap_operator.status import Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Planned:
    """A plan and what it was made from (the defaults are the settings', fixed)."""

    views: tuple[NodeView, ...]
    deployments: list[ModelDeployment]
    assignments: dict[str, planner.Assignment]
    plan: planner.Plan

    def same_inputs(
        self,
        views: tuple[NodeView, ...],
        deployments: list[ModelDeployment],
        assignments: dict[str, planner.Assignment],
    ) -> bool:
        """Equal node views and assignments, and the very same decoded deployments (one
        is decoded again only when its body changed), in the same order."""
        return (
            len(deployments) == len(self.deployments)
            and all(a is b for a, b in zip(deployments, self.deployments, strict=True))
            and views == self.views
            and assignments == self.assignments
        )


def verdicts_of(plan: planner.Plan) -> dict[str, Verdict]:
    """Each planned model's verdict: where it goes, or why it goes nowhere."""
    verdicts = {}
    for uid, p in plan.placed.items():
        verdicts[uid] = Verdict(node=p.node, gpu=p.gpu, policy=p.policy, reason=p.reason,
                                message=p.message)  # fmt: skip
    for uid, u in plan.unplaced.items():
        verdicts[uid] = Verdict(policy=u.policy, reason=u.reason, message=u.message,
                                problem_field=u.field,
                                policy_invalid=u.reason == "PolicyInvalid")  # fmt: skip
    return verdicts


class Placer:
    def __init__(self, metrics: OperatorMetrics) -> None:
        self.metrics = metrics
        self._assignments: dict[str, planner.Assignment] = {}
        #: The last plan made and its inputs.
        self.last_plan: Planned | None = None
        self._swapnodes_read: ReadOnce[SwapNode | ContractError] = ReadOnce(read_swapnode)

    @property
    def assignments(self) -> Mapping[str, planner.Assignment]:
        """Where the last plan put each model."""
        return self._assignments

    def drop(self, uid: str) -> planner.Assignment | None:
        """Forget a deleted model's placement; answers where it was."""
        return self._assignments.pop(uid, None)

    def place(
        self,
        swapnodes: Mapping[str, Body],
        deployments: Mapping[str, Body],
        live: set[str],
        active: list[ModelDeployment],
        defaults: Mapping[str, Any],
    ) -> dict[str, Verdict]:
        nodes = []
        for name in sorted(live):
            node = self._swapnodes_read(name, swapnodes[name])
            if isinstance(node, ContractError):
                log.warning("SwapNode %s cannot be read, leaving it out: %s", name, node)
                continue
            nodes.append(node)
        self._swapnodes_read.keep(swapnodes)
        assignments = dict(self._assignments)
        for deployment in active:
            uid = str(deployment.metadata["uid"])
            status = deployments[uid].get("status") or {}
            if uid not in assignments and status.get("node") and status.get("gpu"):
                assignments[uid] = planner.Assignment(node=status["node"], gpu=status["gpu"])
        views = node_views(nodes)
        last = self.last_plan
        if last is not None and last.same_inputs(views, active, assignments):
            plan = last.plan  # planning is pure: the same inputs, the same plan
        else:
            started = time.monotonic()
            plan = planner.plan_views(views, active, assignments, defaults)
            self.metrics.plan_seconds.observe(time.monotonic() - started)
            self._assignments = {
                uid: planner.Assignment(node=p.node, gpu=p.gpu) for uid, p in plan.placed.items()
            }
        # this turn's inputs are kept even when they equal the last: the next turn's
        # assignments are then these very objects, compared by identity, not field by field
        self.last_plan = Planned(views, active, assignments, plan)
        return verdicts_of(plan)
