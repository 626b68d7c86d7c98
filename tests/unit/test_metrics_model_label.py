"""Every per-model series carries `model` = the name users call (`spec.model.name`, else
metadata.name), the agent's as the gateway's (docs/METRICS.md): one model's series join
(issue 12, finding 11)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from modelswap_api.control import DesiredEntry
from modelswap_api.policy import EffectivePolicy
from modelswap_sidecar.agent.core.actuator import labels_of
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.ports import reports
from modelswap_sidecar.allocators.sim import SimAllocator
from modelswap_sidecar.engine.core import Engine, EngineSettings
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import ModelConfig
from modelswap_sidecar.engine.vouching import RegisteredVoucher
from modelswap_sidecar.metrics import NodeMetrics
from tests.support.agent_harness import entry, new_uid

MIB = 1 << 20
GPU = "sim-gpu-0"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    allocator = SimAllocator(capacities_bytes=[64 * MIB], pool_chunk_bytes=32 * MIB)
    store = HostStore(tmp_path / "store", {0: 64 * MIB})
    engine = Engine(
        allocator,
        store,
        RegisteredVoucher(),
        EngineSettings(),
        decider=lambda name: engine.swap_in(name),  # noqa: PLW0108 - built by this call
    )
    try:
        yield engine
    finally:
        engine.close()
        allocator.close()


def deployment(name: str, model_name: str | None) -> AgentModel:
    wire = entry(new_uid(), name=name)
    if model_name is not None:
        wire["spec"]["model"]["name"] = model_name
    desired = DesiredEntry.from_dict(wire)
    return AgentModel(entry=desired, policy=EffectivePolicy.from_status(desired.policy))


def test_the_model_label_is_the_user_facing_name(engine: Engine) -> None:
    named = deployment("classify-prod", "classify")
    plain = deployment("embed", None)
    assert labels_of(named).name == "classify" and labels_of(plain).name == "embed"
    registry = CollectorRegistry()
    NodeMetrics(registry, lambda: reports.node_sample(engine, [named, plain], (GPU,)))
    for model, label in ((named, "classify"), (plain, "embed")):
        labels = {"uid": model.uid, "namespace": "default", "model": label}
        assert registry.get_sample_value("modelswap_model_host_bytes", labels) == 0.0
    assert (
        registry.get_sample_value(
            "modelswap_model_host_bytes",
            {"uid": named.uid, "namespace": "default", "model": "classify-prod"},
        )
        is None
    )
    # the control API still reports the ModelDeployment's own name
    assert reports.model_infos(engine, [named], (GPU,))[0].name == "classify-prod"


def test_the_engine_answers_a_model_state_alone_as_its_status_does(engine: Engine) -> None:
    """The gateway's per-request residency check reads `state` instead of a whole status."""
    engine.add_model(ModelConfig("m", 0))
    assert engine.state("m") is engine.status("m").state
    with pytest.raises(UnknownModel):
        engine.state("never-added")
