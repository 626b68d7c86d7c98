"""What the engine reports about a model (`ModelStatus`), and its JSON form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelswap_sidecar.engine.records import CopyReport, KvReport
from modelswap_sidecar.engine.states import EngineState


@dataclass(frozen=True, slots=True)
class ModelStatus:
    name: str
    gpu: int
    state: EngineState
    phase: str
    epoch: int
    resident_bytes: int
    instances: int
    swap_ins: int
    swap_outs: int
    last_swap_in_seconds: float
    kv_discarded: bool
    reason: str
    #: live instance → seconds since its last heartbeat (None: none received yet)
    last_heartbeat_ages_seconds: dict[str, float | None] = field(default_factory=dict)
    #: what the last swap-in copied and how fast; `scaled` when paced (sim emulation)
    last_swap_in_copy: CopyReport = field(default_factory=CopyReport)
    #: the KV reports of its live instances' last heartbeats, summed
    kv: KvReport = field(default_factory=KvReport)


def as_dict(status: ModelStatus) -> dict[str, Any]:
    return {
        "name": status.name,
        "gpu": status.gpu,
        "state": str(status.state),
        "phase": status.phase,
        "epoch": status.epoch,
        "resident_bytes": status.resident_bytes,
        "instances": status.instances,
        "swap_ins": status.swap_ins,
        "swap_outs": status.swap_outs,
        "last_swap_in_seconds": status.last_swap_in_seconds,
        "kv_discarded": status.kv_discarded,
        "reason": status.reason,
        "last_heartbeat_ages_seconds": status.last_heartbeat_ages_seconds,
        "last_swap_in_copy": status.last_swap_in_copy.as_doc(),
        "kv": status.kv.as_doc(),
    }
