"""What the agent reports: `ModelInfo`/`NodeInfo` for the control API and the metrics'
state sample, read from the records and the engine (no side effects)."""

from __future__ import annotations

import datetime
import functools
from collections.abc import Iterable, Sequence

from modelswap_api.control import ModelInfo, NodeInfo
from modelswap_api.models import GpuStatus, Link
from modelswap_sidecar.agent.core import instances
from modelswap_sidecar.agent.core.isolation import FAULT_REASON, fault_message, guarded
from modelswap_sidecar.agent.core.records import LOADED, AgentModel, answers, user_name_of
from modelswap_sidecar.engine.core import Engine, ModelStatus
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.metrics import GpuSample, ModelLabels, ModelSample, NodeSample
from modelswap_sidecar.model_states import Serving, reported_state


def rfc3339(wall_seconds: float | None) -> str | None:
    if wall_seconds is None:
        return None
    moment = datetime.datetime.fromtimestamp(wall_seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def status_of(engine: Engine, model: AgentModel) -> ModelStatus | None:
    if not model.attaches:
        return None
    try:
        return engine.status(model.triton_name)
    except UnknownModel:
        return None


def host_bytes_of(engine: Engine, model: AgentModel) -> int:
    """Bytes the model holds in the host store: weights, preserved KV, the KV host tier."""
    try:
        return engine.host_bytes_of(model.triton_name)
    except UnknownModel:
        return 0


def fault_info(model: AgentModel) -> ModelInfo:
    """What is reported for a model whose report itself failed: its identity, `Failed`."""
    rollout = model.rollout
    return ModelInfo(
        uid=model.deployment_uid,
        namespace=model.entry.namespace,
        name=model.entry.name,
        generation=model.entry.generation,
        model_generation=model.model_generation,
        rollout_reason=rollout.reason if rollout is not None else None,
        rollout_model_generation=rollout.model_generation if rollout is not None else None,
        rollout_message=rollout.message if rollout is not None else None,
        state=str(EngineState.FAILED),
        phase="Failed",
        desired=model.desired,
        reason=FAULT_REASON,
        message=fault_message(model) or None,
    )


def reported(models: Iterable[AgentModel]) -> list[AgentModel]:
    """One instance per ModelDeployment, the one that serves it (`instances.chosen`): the
    operator and the control API see ModelDeployments, in the records' order. Several
    instances of one uid exist only while one of them is superseded (a rollout), so
    without any the records are taken as they are (the gateway asks on every request)."""
    models = list(models)
    if not any(m.superseded for m in models):
        return models
    grouped = instances.by_deployment(models)
    shown = {
        uid: instances.chosen(held, answers, lambda m: not m.superseded)
        for uid, held in grouped.items()
    }
    return [m for m in models if shown.get(m.deployment_uid) is m]


def model_infos(
    engine: Engine, models: Iterable[AgentModel], gpu_uuids: tuple[str, ...]
) -> list[ModelInfo]:
    """`model_info` of each model, one at a time (`isolation`): a model whose report fails,
    or with any other fault, is listed as `fault_info`."""
    infos = []
    for model in list(models):
        info = guarded(
            model,
            "report",
            lambda m: model_info(engine, m, gpu_uuids),
            functools.partial(fault_info, model),
        )
        infos.append(fault_info(model) if model.faults else info)
    return infos


def model_info(engine: Engine, model: AgentModel, gpu_uuids: tuple[str, ...]) -> ModelInfo:
    """The model as the control API reports it (`model_infos` reports faults over it)."""
    status = status_of(engine, model)
    state, phase = reported_state(
        model.serving,
        attaches=model.attaches,
        engine_state=status.state if status is not None else None,
    )
    resident = status.resident_bytes if status is not None else 0
    if model.serving is Serving.LOADED and not model.attaches:
        resident = model.hbm_bytes
    message = model.message or (status.reason if status is not None else "")
    reason = model.reason
    if reason == LOADED and status is not None and phase != "Resident":
        # loaded once; since then the engine moved it (a swap, a drop): its phase is the
        # reason, so a dropped model never reads `Loaded` beside "making room for ..."
        reason = phase
    rollout = model.rollout
    return ModelInfo(
        uid=model.deployment_uid,
        namespace=model.entry.namespace,
        name=model.entry.name,
        generation=model.entry.generation,
        model_generation=model.model_generation,
        rollout_reason=rollout.reason if rollout is not None else None,
        rollout_model_generation=rollout.model_generation if rollout is not None else None,
        rollout_message=rollout.message if rollout is not None else None,
        state=state,
        phase=phase,
        desired=model.desired,
        gpu=gpu_uuids[model.gpu] if model.gpu is not None else None,
        resident_bytes=resident,
        host_bytes=host_bytes_of(engine, model),
        **kv_bytes_of(status),
        last_request_time=rfc3339(model.last_request_wall_seconds),
        swap_ins=max(model.swap_ins, status.swap_ins if status else 0),
        swap_outs=max(model.swap_outs, status.swap_outs if status else 0),
        last_swap_in_seconds=(
            status.last_swap_in_seconds if status and status.last_swap_in_seconds else None
        ),
        reason=reason or None,
        message=message or None,
    )


def kv_bytes_of(status: ModelStatus | None) -> dict[str, int]:
    """`ModelInfo`'s KV bytes per tier: what the model's session stores said with their
    last heartbeats; GPU bytes only while its memory is mapped (a swapped-out model's KV
    region holds no GPU memory, whatever its store last said)."""
    if status is None:
        return {}
    kv = status.kv
    gpu = kv.device_bytes if status.resident_bytes > 0 else 0
    return {"kv_gpu_bytes": gpu, "kv_host_bytes": kv.host_bytes}


def node_info(
    engine: Engine,
    node_name: str,
    agent_version: str,
    gpu_uuids: tuple[str, ...],
    *,
    products: Sequence[str] | None = None,
    links: Sequence[Link] | None = None,
) -> NodeInfo:
    """`products`/`links` per GPU (cuda-vmm: the device name and the probed link); without
    them every GPU reads product `sim`, link kind `sim`."""
    gpus = []
    for ordinal, uuid in enumerate(gpu_uuids):
        view = engine.budget(ordinal)
        gpus.append(
            GpuStatus(
                uuid=uuid,
                ordinal=ordinal,
                product=products[ordinal] if products is not None else "sim",
                hbm_total_bytes=view.total_bytes,
                hbm_reserved_bytes=view.reserve_bytes,
                per_process_overhead_bytes=view.overhead_bytes_per_process,
                hbm_free_bytes=view.available_bytes,
                host_store_bytes=engine.host_store_bytes(ordinal),
                host_store_capacity_bytes=engine.host_store_capacity_bytes(ordinal),
                link=links[ordinal] if links is not None else Link(kind="sim"),
            )
        )
    return NodeInfo(node_name=node_name, agent_version=agent_version, gpus=tuple(gpus))


def kv_report_of(engine: Engine, model: AgentModel) -> dict[str, int]:
    """The model's KV figures as `ModelSample` fields: what its processes' session stores
    reported with their last heartbeats (none: no fields, zeros)."""
    status = status_of(engine, model)
    if status is None:
        return {}
    kv = status.kv
    return {
        "kv_device_blocks": kv.device_blocks,
        "kv_host_blocks": kv.host_blocks,
        "kv_hits": kv.hits,
        "kv_misses": kv.misses,
        "kv_evictions": kv.evictions,
        "kv_tokens_reused": kv.tokens_reused,
        "kv_tokens_recomputed": kv.tokens_recomputed,
    }


def node_sample(engine: Engine, models: list[AgentModel], gpu_uuids: tuple[str, ...]) -> NodeSample:
    gpus = []
    for ordinal, uuid in enumerate(gpu_uuids):
        view = engine.budget(ordinal)
        gpus.append(
            GpuSample(
                gpu=uuid,
                total_bytes=view.total_bytes,
                reserved_bytes=view.reserve_bytes,
                overhead_bytes=view.overhead_bytes_per_process * view.processes,
                used_bytes=view.used_bytes,
                host_store_bytes=engine.host_store_bytes(ordinal),
                host_store_capacity_bytes=engine.host_store_capacity_bytes(ordinal),
            )
        )
    # the `model` label is the name users call (the gateway's series carry the same)
    models = reported(models)
    names = {m.deployment_uid: user_name_of(m.entry) for m in models}
    kv = {m.deployment_uid: kv_report_of(engine, m) for m in models}
    samples = [
        ModelSample(
            model=ModelLabels(
                uid=info.uid, namespace=info.namespace, name=names.get(info.uid, info.name)
            ),
            state=info.state,
            resident_bytes=info.resident_bytes,
            host_bytes=info.host_bytes,
            **kv.get(info.uid, {}),
        )
        for info in model_infos(engine, models, gpu_uuids)
    ]
    return NodeSample(gpus=gpus, models=samples)
