"""What the control API and the SwapNode report say of an attached model: once loaded, its
reason follows the engine (a dropped model never reads `Loaded`)."""

from __future__ import annotations

import uuid
from typing import cast

import pytest

from modelswap_api.control import DesiredEntry
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import ModelDeploymentSpec
from modelswap_api.policy import effective_policy
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.ports import reports
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.engine.states import EngineState, phase_of
from modelswap_sidecar.engine.status import ModelStatus
from modelswap_sidecar.model_states import Serving

SPEC = {"model": {"source": {"uri": "/models/mlp"}, "weightsBytes": "32Mi"}}


def loaded_model() -> AgentModel:
    entry = DesiredEntry(
        uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, "reports")),
        namespace="ns",
        name="mlp",
        generation=1,
        spec=ModelDeploymentSpec.from_dict(SPEC),
        policy=effective_policy(SPEC, BUILTIN_DEFAULTS).to_status(),
    )
    m = AgentModel(entry=entry, policy=effective_policy(SPEC, BUILTIN_DEFAULTS))
    m.gpu, m.serving = 0, Serving.LOADED
    m.reason, m.message = m.loaded_reason()
    return m


class OneModelEngine:
    """Holds one model in `state`, its last change explained by `why`."""

    def __init__(self, state: EngineState, why: str) -> None:
        self.state, self.why = state, why

    def status(self, name: str) -> ModelStatus:
        return ModelStatus(
            name=name,
            gpu=0,
            state=self.state,
            phase=phase_of(self.state).phase,
            epoch=1,
            resident_bytes=0,
            instances=1,
            swap_ins=1,
            swap_outs=1,
            last_swap_in_seconds=0.0,
            kv_discarded=False,
            reason=self.why,
        )

    def host_bytes_of(self, name: str) -> int:
        return 0


@pytest.mark.parametrize(
    ("state", "why", "reason"),
    [
        (EngineState.RESIDENT, "swapped in", "Loaded"),
        (EngineState.DROPPED, "making room for m-2", "Dropped"),
        (EngineState.SWAPPED_OUT, "idle 600 s", "SwappedOut"),
        (EngineState.LOADING, "reloading from the source after dropped", "Loading"),
    ],
)
def test_a_loaded_models_reason_is_its_engine_phase_once_the_engine_moved_it(
    state: EngineState, why: str, reason: str
) -> None:
    model = loaded_model()
    engine = cast(Engine, OneModelEngine(state, why))
    info = reports.model_info(engine, model, ("g0",))
    assert (info.phase, info.reason, info.message) == (phase_of(state).phase, reason, why)


def test_an_agent_reason_other_than_loaded_is_kept_whatever_the_engine_says() -> None:
    model = loaded_model()
    model.reason, model.message = "ReloadTimedOut", "no request loaded it within 60 s"
    engine = cast(Engine, OneModelEngine(EngineState.DROPPED, "reload timed out"))
    info = reports.model_info(engine, model, ("g0",))
    assert (info.phase, info.reason) == ("Dropped", "ReloadTimedOut")
    assert info.message == "no request loaded it within 60 s"
