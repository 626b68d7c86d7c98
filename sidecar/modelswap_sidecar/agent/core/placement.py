"""Pure: which GPU a model that is not in HBM yet goes to, or why it must wait.

A new model is loaded into HBM, so placing it is a swap-in request: on each candidate GPU
the policy's admission is asked as if the model were swapped out there. The first GPU that
admits it without victims wins (most free bytes first), then one that admits it after
swapping victims out; otherwise the model is deferred with the admissions' reasons.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from modelswap_sidecar.policy.admission import admit
from modelswap_sidecar.policy.decisions import Admission, AdmissionOutcome, SwapOut
from modelswap_sidecar.policy.inputs import ModelView, NodeView, PolicySettings, Residency


@dataclass(frozen=True, kw_only=True)
class Placement:
    gpu: str
    victims: tuple[SwapOut, ...]
    message: str


@dataclass(frozen=True, kw_only=True)
class Deferral:
    reason: str  # CamelCase
    message: str


def place(
    node: NodeView,
    candidate: ModelView,
    gpus: Sequence[str],
    now_seconds: float,
    settings: PolicySettings,
) -> Placement | Deferral:
    """Place `candidate` (its `gpu` and residency are ignored) on one of `gpus`."""
    if not gpus:
        return Deferral(reason="NoGpu", message="no GPU of this node is eligible")
    others = tuple(m for m in node.models if m.uid != candidate.uid)

    def free(gpu: str) -> int:
        return node.gpu(gpu).budget_bytes - node.used_bytes(gpu)

    admissions: list[tuple[str, Admission]] = []
    for gpu in sorted(gpus, key=lambda g: (-free(g), g)):
        trial = dataclasses.replace(
            candidate, gpu=gpu, residency=Residency.SWAPPED_OUT, resident_since_seconds=None
        )
        view = NodeView(gpus=node.gpus, models=(*others, trial))
        admissions.append((gpu, admit(view, candidate.uid, now_seconds, settings)))
    admitted = [(g, a) for g, a in admissions if a.outcome is AdmissionOutcome.ADMIT]
    admitted.sort(key=lambda ga: len(ga[1].victims) > 0)  # stable: free GPUs first
    if admitted:
        gpu, admission = admitted[0]
        return Placement(gpu=gpu, victims=admission.victims, message=admission.message)
    waiting = [a for _, a in admissions if a.outcome is AdmissionOutcome.WAIT]
    chosen = waiting[0] if waiting else admissions[0][1]
    reason = "WaitingForRoom" if waiting else "InsufficientHBM"
    message = "; ".join(f"{g}: {a.message}" for g, a in admissions)
    return Deferral(reason=reason, message=f"{chosen.reason}: {message}")
