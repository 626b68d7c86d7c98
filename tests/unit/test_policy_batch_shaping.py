"""`spec.gateway.batchShaping` (issue 29, item 5): off by default, merged over the cluster
defaults, carried in the effective policy's wire form to the agent and its routes, and
refused with its field path when malformed (more in tests/data/invalid/shaping-*.yaml)."""

import copy
from typing import Any

import pytest

from modelswap_api.defaults import BUILTIN_DEFAULTS, check_defaults
from modelswap_api.errors import PolicyError
from modelswap_api.models import BatchShapingPolicy, EffectivePolicyStatus
from modelswap_api.policy import SHAPING_OFF, EffectivePolicy, effective_policy
from modelswap_api.resources import validate_resource

ON = {"maxWaitMilliseconds": 20, "promptBytesEdges": [256, 1024, 4096]}


def deployment(shaping: Any) -> dict[str, Any]:
    return {
        "apiVersion": "modelswap.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "default"},
        "spec": {
            "model": {"source": {"uri": "/models/tinylm"}, "weightsBytes": "32Mi"},
            "gateway": {"batchShaping": shaping},
        },
    }


def test_off_by_default() -> None:
    policy = effective_policy({}, BUILTIN_DEFAULTS)
    assert policy.batch_shaping == SHAPING_OFF
    assert policy.batch_shaping.max_wait_milliseconds == 0


def test_a_spec_turns_it_on_and_it_travels_in_the_status() -> None:
    policy = effective_policy({"gateway": {"batchShaping": ON}}, BUILTIN_DEFAULTS)
    assert policy.batch_shaping == BatchShapingPolicy(
        max_wait_milliseconds=20, prompt_bytes_edges=(256, 1024, 4096)
    )
    wire = policy.to_status().to_dict()
    assert wire["batchShaping"] == ON
    assert EffectivePolicy.from_status(EffectivePolicyStatus.from_dict(wire)) == policy


def test_defaults_and_wire_policies_from_before_it_are_off() -> None:
    older = copy.deepcopy(dict(BUILTIN_DEFAULTS))
    older["gateway"] = {"maxQueued": 100, "queueTimeout": "60s"}
    assert check_defaults(older)["gateway"]["batchShaping"]["maxWaitMilliseconds"] == 0
    wire = effective_policy({}, BUILTIN_DEFAULTS).to_status().to_dict()
    del wire["batchShaping"]
    back = EffectivePolicy.from_status(EffectivePolicyStatus.from_dict(wire))
    assert back.batch_shaping == SHAPING_OFF


def test_a_valid_setting_passes() -> None:
    assert validate_resource(deployment(ON)).errors == ()
    single = {"maxWaitMilliseconds": 1000, "promptBytesEdges": [1]}
    assert validate_resource(deployment(single)).errors == ()


@pytest.mark.parametrize(
    ("shaping", "path"),
    [
        ({"maxWaitMilliseconds": 20, "promptBytesEdges": [512, 256]}, "promptBytesEdges"),
        ({"maxWaitMilliseconds": 20, "promptBytesEdges": [1, 2, 3, 4, 5, 6, 8, 8]},
         "promptBytesEdges"),
        ({"maxWaitMilliseconds": 20, "promptBytesEdges": list(range(1, 10))},
         "promptBytesEdges"),
        ({"maxWaitMilliseconds": 20, "promptBytesEdges": [-1]}, "promptBytesEdges[0]"),
        ({"maxWaitMilliseconds": 1001, "promptBytesEdges": [5]}, "maxWaitMilliseconds"),
        ({"maxWaitMilliseconds": -1, "promptBytesEdges": [5]}, "maxWaitMilliseconds"),
        ({"maxWaitMilliseconds": 5, "promptBytesEdges": []}, "promptBytesEdges"),
        ({"promptBytesEdges": [5]}, "maxWaitMilliseconds"),
    ],
)  # fmt: skip
def test_a_malformed_setting_is_refused_naming_its_field(shaping: Any, path: str) -> None:
    errors = validate_resource(deployment(shaping)).errors
    assert [e.path for e in errors] == [f"spec.gateway.batchShaping.{path}"], errors


def test_a_malformed_wire_policy_is_refused_naming_it() -> None:
    wire = effective_policy({}, BUILTIN_DEFAULTS).to_status().to_dict()
    wire["batchShaping"] = {"maxWaitMilliseconds": 20, "promptBytesEdges": [9, 3]}
    with pytest.raises(PolicyError) as caught:
        EffectivePolicy.from_status(EffectivePolicyStatus.from_dict(wire))
    assert [e.path for e in caught.value.errors] == ["batchShaping"]
