"""The agent's core over fakes: an `AgentModel` as a desired entry makes it, an engine that
holds every model resident, and an `Actuator` built over a fake engine and loader (no
Triton, no memory engine). For the unit tests of reloads, drains and unloads."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace
from typing import Any, cast

from modelswap_api.control import DesiredEntry
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import ModelDeploymentSpec
from modelswap_api.policy import effective_policy
from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.loading import ModelLoader
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.facade import Policy
from modelswap_sidecar.policy.inputs import PolicySettings

MIB = 1 << 20
SPEC: dict[str, Any] = {"model": {"source": {"uri": "/models/toy"}, "weightsBytes": "32Mi"}}


def agent_model(
    name: str,
    serving: Serving = Serving.LOADED,
    *,
    spec: dict[str, Any] = SPEC,
    attaches: bool = True,
) -> AgentModel:
    """Model `name` of namespace `ns` (its uid derived from the name) on GPU 0."""
    entry = DesiredEntry(
        uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        namespace="ns",
        name=name,
        generation=1,
        spec=ModelDeploymentSpec.from_dict(spec),
        policy=effective_policy(spec, BUILTIN_DEFAULTS).to_status(),
    )
    model = AgentModel(entry=entry, policy=effective_policy(spec, BUILTIN_DEFAULTS))
    model.serving, model.gpu, model.attaches = serving, 0, attaches
    return model


class ResidentEngine:
    """One 128 MiB GPU; every model it knows is resident unless `states` says otherwise."""

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.states: dict[str, EngineState] = {}

    def statuses(self) -> list[Any]:
        return []

    def budget(self, ordinal: int) -> Any:
        return SimpleNamespace(budget_bytes=128 * MIB)

    def state(self, name: str) -> EngineState:
        return self.states.get(name, EngineState.RESIDENT)

    def gpu_of(self, name: str) -> int:
        raise UnknownModel(name)

    def remove_model(self, name: str) -> None:
        self.removed.append(name)

    def subscribe(self, listener: Any) -> None:
        pass


def actuator_over(engine: object, loader: object, *models: AgentModel) -> Actuator:
    """An actuator holding `models`, over a fake `engine` and `loader` (one GPU, g0)."""
    return Actuator(
        engine=cast(Engine, engine),
        loader=cast(ModelLoader, loader),
        policy=Policy(PolicySettings(), time.monotonic),
        gpu_uuids=("g0",),
        metrics=None,
        records={m.uid: m for m in models},
    )
