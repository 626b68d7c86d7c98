"""Fencing reaches the agent's placing through the policy loop's `may_load_new` (the
control service's rule, given to the loop when it is built): while it holds, every model
waiting for a place is deferred, `Fenced`, and nothing is loaded."""

from __future__ import annotations

import asyncio
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
from modelswap_sidecar.agent.core.loops import PolicyLoop
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.facade import Policy
from modelswap_sidecar.policy.inputs import PolicySettings
from modelswap_sidecar.triton.driver import TritonDriver

MIB = 1 << 20
SPEC = {"model": {"source": {"uri": "/models/mlp"}, "weightsBytes": "32Mi"}}


class IdleEngine:
    """What the policy loop reads of an engine holding nothing, on one 128 MiB GPU."""

    def statuses(self) -> list[Any]:
        return []

    def budget(self, ordinal: int) -> Any:
        return SimpleNamespace(budget_bytes=128 * MIB)


class QuietDriver:
    async def all_statistics(self) -> dict[str, Any]:
        return {}


class NoLoader:
    async def load(self, model: AgentModel) -> None:
        raise AssertionError("nothing is loaded while fenced")


def pending(name: str) -> AgentModel:
    entry = DesiredEntry(
        uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        namespace="ns",
        name=name,
        generation=1,
        gpu="g0",  # the operator's GPU: placing reads nothing of the engine's records
        spec=ModelDeploymentSpec.from_dict(SPEC),
        policy=effective_policy(SPEC, BUILTIN_DEFAULTS).to_status(),
    )
    return AgentModel(entry=entry, policy=effective_policy(SPEC, BUILTIN_DEFAULTS))


def loop_over(model: AgentModel, fenced: list[bool]) -> tuple[Actuator, PolicyLoop]:
    actuator = Actuator(
        engine=cast(Engine, IdleEngine()),
        loader=cast(ModelLoader, NoLoader()),
        policy=Policy(PolicySettings(), time.monotonic),
        gpu_uuids=("g0",),
        metrics=None,
        records={model.uid: model},
    )
    loop = PolicyLoop(
        actuator,
        cast(TritonDriver, QuietDriver()),
        interval_seconds=0.5,
        metrics=None,
        may_load_new=lambda: not fenced[0],
    )
    return actuator, loop


def test_a_fenced_agent_defers_what_waits_and_places_it_once_unfenced() -> None:
    model = pending("m")
    fenced = [True]
    actuator, loop = loop_over(model, fenced)

    async def scenario() -> None:
        await loop.tick()
        assert (model.serving, model.reason) == (Serving.DEFERRED, "Fenced")
        fenced[0] = False
        actuator.loader = cast(ModelLoader, SimpleNamespace(load=_loaded))
        await loop.tick()
        assert model.serving is Serving.LOADING and model.gpu == 0
        await actuator.close()

    asyncio.run(scenario())


async def _loaded(model: AgentModel) -> None:
    await asyncio.sleep(0)
