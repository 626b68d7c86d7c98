"""A desired entry carries its effective policy: the agent applies it as given (it keeps no
defaults of its own), `parse_desired_set` requires it and checks it naming the field, and
local mode sends it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from modelswap_api.control import DesiredEntry, parse_desired_set
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.errors import ModelError, PolicyError, ResourceError
from modelswap_api.models import EffectivePolicyStatus, ModelDeploymentSpec
from modelswap_api.policy import EffectivePolicy, effective_policy
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.core.views import GpuBudget, node_view
from modelswap_sidecar.agent.ports.backend import AgentBackend
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.local.desired import Generations, desired_set
from modelswap_sidecar.local.manifests import LocalModel
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.inputs import PolicySettings
from modelswap_sidecar.policy.swapouts import plan_swap_outs

MIB = 1 << 20
SPEC = {"model": {"source": {"uri": "/models/mlp"}, "weightsBytes": "32Mi"}}  # no policy
UID = "0b6e0d2e-1b7c-4a44-8f4e-0d3c1f0a9b11"
OTHER_UID = "5b0e3c1d-0000-4000-8000-000000000002"
#: What the operator would send for a ModelDeployment whose effective policy idles at 1 s.
ONE_SECOND = dataclasses.replace(
    effective_policy(SPEC, BUILTIN_DEFAULTS).to_status(), idle_after="1s", min_resident="0s"
)


def entry(policy: EffectivePolicyStatus) -> DesiredEntry:
    return DesiredEntry(
        uid=UID,
        namespace="ns",
        name="mlp",
        generation=1,
        spec=ModelDeploymentSpec.from_dict(SPEC),
        policy=policy,
    )


def idle_swap_outs_at(policy: EffectivePolicy, now_seconds: float) -> list[str]:
    """Swap-outs the policy plans for a model resident and last asked at 0 s."""
    model = AgentModel(
        entry=entry(policy.to_status()), policy=policy, serving=Serving.LOADED, gpu=0
    )
    model.resident_since_seconds = model.last_request_seconds = 0.0
    gpus = [GpuBudget(ordinal=0, uuid="g0", budget_bytes=96 * MIB)]
    view = node_view([model], {model.triton_name: EngineState.RESIDENT}, gpus, now_seconds)
    return [s.uid for s in plan_swap_outs(view, now_seconds, PolicySettings())]


def test_the_entrys_policy_is_applied_as_given_and_swaps_out_after_1s() -> None:
    policy = AgentBackend.policy_of(entry(ONE_SECOND))
    assert policy.idle_after.seconds == 1 and policy.to_status() == ONE_SECOND
    assert idle_swap_outs_at(policy, 0.5) == []
    assert idle_swap_outs_at(policy, 1.5) == [UID]
    # The built-in defaults (idleAfter 10m), when the sender merged over them.
    merged = AgentBackend.policy_of(entry(effective_policy(SPEC, BUILTIN_DEFAULTS).to_status()))
    assert merged.idle_after.raw == "10m"
    assert idle_swap_outs_at(merged, 1.5) == []


def test_from_status_names_a_missing_or_bad_field() -> None:
    with pytest.raises(PolicyError) as missing:
        EffectivePolicy.from_status(dataclasses.replace(ONE_SECOND, kv_host_bytes=None))
    assert [e.path for e in missing.value.errors] == ["kvHostBytes"]
    with pytest.raises(PolicyError) as rule:
        EffectivePolicy.from_status(dataclasses.replace(ONE_SECOND, min_resident="1h"))
    assert [e.path for e in rule.value.errors] == ["minResident"]


def body(policy: dict[str, Any]) -> dict[str, Any]:
    return {
        "revision": {"term": 1, "counter": 1},
        "entries": [
            {"uid": UID, "namespace": "ns", "name": "mlp", "generation": 1, "spec": SPEC,
             "policy": ONE_SECOND.to_dict()},
            {"uid": OTHER_UID, "namespace": "ns", "name": "b", "generation": 1, "spec": SPEC,
             "policy": policy},
        ],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"idleAfter": "soon"}, "entries[1].policy.idleAfter"),
        ({"queueTimeout": "-1s"}, "entries[1].policy.queueTimeout"),
        ({"priority": -1}, "entries[1].policy.priority"),
        ({"kvHostBytes": -5}, "entries[1].policy.kvHostBytes"),
        ({"onSwapOut": "disk"}, "entries[1].policy.onSwapOut"),
    ],
)
def test_a_bad_policy_field_is_refused_naming_it(change: dict[str, Any], field: str) -> None:
    good = ONE_SECOND.to_dict()
    assert parse_desired_set(body(good)).entries[1].policy == ONE_SECOND
    with pytest.raises(ResourceError) as refused:
        parse_desired_set(body({**good, **change}))
    assert [e.path for e in refused.value.errors] == [field]
    incomplete = {k: v for k, v in good.items() if k != "idleAfter"}
    with pytest.raises(ResourceError, match=r"entries\[1\]\.policy\.idleAfter: Required"):
        parse_desired_set(body(incomplete))


def test_an_entry_without_a_policy_is_refused_naming_it() -> None:
    without = body(ONE_SECOND.to_dict())
    del without["entries"][0]["policy"]
    with pytest.raises(ModelError, match=r"entries\[0\]\.policy: required"):
        parse_desired_set(without)


def test_local_mode_sends_each_models_effective_policy() -> None:
    spec = {**SPEC, "swapPolicy": {"idleAfter": "1s", "minResident": "0s"}}
    policy = effective_policy(spec, BUILTIN_DEFAULTS)
    local = LocalModel(Path("m.yaml"), "default", "mlp", UID, spec, policy)
    sent = desired_set([local], Generations(), counter=1, node_name="node-a")
    assert sent.entries[0].policy == policy.to_status()
    assert parse_desired_set(sent.to_dict()).entries[0].policy == policy.to_status()
