"""What the planner returns: one `Placed` or `Unplaced` per ModelDeployment, by UID.

Reasons are CamelCase, as Kubernetes condition reasons are; the operator copies them into
the `Placed` condition. `Unplaced.field` names the spec field a user would change to make
the model placeable (None when no spec field is at fault, e.g. no live node at all).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from modelswap_api.policy import EffectivePolicy


class PlacedReason(enum.StrEnum):
    """Why a model is where the plan puts it."""

    KEPT = "Kept"  # its assignment is unchanged
    PLACED = "Placed"  # it had no assignment
    NODE_LOST = "NodeLost"  # moved: its node is absent (stale Lease, or removed)
    GPU_LOST = "GpuLost"  # moved: its node no longer reports its GPU
    SELECTOR_CHANGED = "SelectorChanged"  # moved: nodeSelector / gpuSelector no longer match
    TAINT_NOT_TOLERATED = "TaintNotTolerated"  # moved: its node has a taint it does not tolerate
    NO_LONGER_FITS = "NoLongerFits"  # moved: its GPU cannot hold every model kept there


class UnplacedReason(enum.StrEnum):
    """Why a model has no place in the plan."""

    POLICY_INVALID = "PolicyInvalid"  # its effective policy breaks a rule
    NO_SWAP_NODES = "NoSwapNodes"  # no live SwapNode reports a GPU
    NO_MATCHING_NODE = "NoMatchingNode"  # spec.placement.nodeSelector matches no live node
    TAINTS_NOT_TOLERATED = "TaintsNotTolerated"  # every matching node has an untolerated taint
    NO_MATCHING_GPU = "NoMatchingGpu"  # spec.placement.gpuSelector matches no GPU
    EXCEEDS_GPU_BUDGET = "ExceedsGpuBudget"  # larger than every eligible GPU's HBM budget
    EXCEEDS_HOST_STORE = "ExceedsHostStore"  # larger than every eligible GPU's host store
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"  # fits an empty GPU, but none has room now


@dataclass(frozen=True)
class Assignment:
    """Where a model is: a node name and a GPU UUID on it."""

    node: str
    gpu: str

    def __str__(self) -> str:
        return f"{self.node}/{self.gpu}"


@dataclass(frozen=True, kw_only=True)
class Placed:
    uid: str
    node: str
    gpu: str
    policy: EffectivePolicy
    #: the assignment it had when it moved; None when kept or placed for the first time
    moved_from: Assignment | None
    reason: PlacedReason
    message: str

    @property
    def assignment(self) -> Assignment:
        return Assignment(self.node, self.gpu)


@dataclass(frozen=True, kw_only=True)
class Unplaced:
    uid: str
    reason: UnplacedReason
    #: the spec field to change (e.g. `spec.placement.nodeSelector`), or None
    field: str | None
    message: str
    #: None when the policy itself is invalid
    policy: EffectivePolicy | None


@dataclass(frozen=True)
class Plan:
    """Every ModelDeployment appears in exactly one of the two maps (keys: UIDs, sorted)."""

    placed: Mapping[str, Placed]
    unplaced: Mapping[str, Unplaced]

    def assignments(self) -> dict[str, Assignment]:
        """The placed models' assignments: what the next `plan` call takes as input."""
        return {uid: placed.assignment for uid, placed in self.placed.items()}
