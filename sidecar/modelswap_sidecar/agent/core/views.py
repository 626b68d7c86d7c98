"""The policy's `NodeView` from what the agent holds and what the engine reports (no side
effects but `isolation`'s fault bookkeeping).

Only models the runtime serves (or is loading, or dropped and due back) hold or may claim
HBM (`model_states.charged_residency`: a dropped model swapped in whose requests are
loading its weights counts as loading, never a victim); models pending, deferred, failed
or unloaded are left out, and so is a model whose view cannot be made (its fault noted:
the others are still weighed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from modelswap_sidecar.agent.core.isolation import each_record
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import charged_residency
from modelswap_sidecar.policy.inputs import GpuView, ModelView, NodeView, Residency


@dataclass(frozen=True, kw_only=True)
class GpuBudget:
    ordinal: int
    uuid: str
    budget_bytes: int
    #: the GPU's measured link (`Actuator.link_bytes_per_second`)
    host_to_device_bytes_per_second: float = 10e9


def model_view(
    model: AgentModel, residency: Residency, gpu_uuid: str, now_seconds: float
) -> ModelView:
    since = model.resident_since_seconds
    if residency in (Residency.RESIDENT, Residency.SWAPPING_OUT) and since is None:
        since = now_seconds
    return ModelView(
        uid=model.uid,
        gpu=gpu_uuid,
        weights_bytes=model.weights_bytes,
        kv_cache_bytes=model.kv_cache_bytes,
        residency=residency,
        policy=model.policy,
        resident_since_seconds=since,
        last_request_seconds=model.last_request_seconds,
        active_requests=model.active_requests,
    )


def node_view(
    models: Sequence[AgentModel],
    engine_states: Mapping[str, EngineState],
    gpus: Sequence[GpuBudget],
    now_seconds: float,
) -> NodeView:
    """`engine_states` is keyed by Triton model name (the engine's model name)."""
    uuids = {g.ordinal: g.uuid for g in gpus}

    def view_of(m: AgentModel) -> ModelView | None:
        if m.gpu is None or m.gpu not in uuids:
            return None
        residency = charged_residency(
            m.serving,
            attaches=m.attaches,
            engine_state=engine_states.get(m.triton_name),
            requests_in_flight=m.active_requests,
        )
        return None if residency is None else model_view(m, residency, uuids[m.gpu], now_seconds)

    views = [v for v in each_record(models, "weigh the HBM of", view_of) if v is not None]
    return NodeView(
        gpus=tuple(
            GpuView(
                gpu=g.uuid,
                budget_bytes=g.budget_bytes,
                host_to_device_bytes_per_second=g.host_to_device_bytes_per_second,
            )
            for g in gpus
        ),
        models=tuple(views),
    )
