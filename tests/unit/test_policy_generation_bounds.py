"""`spec.gateway.maxTokens` and `maxPromptBytes` (issue 26, item 3): merged, carried in the
effective policy's wire form, and filled in from the built-in values where a defaults set
or a wire policy written before them lacks them."""

import copy
from typing import Any

import pytest

from modelswap_api.defaults import (
    BUILTIN_DEFAULTS,
    DEFAULT_MAX_PROMPT_BYTES,
    DEFAULT_MAX_TOKENS,
    check_defaults,
)
from modelswap_api.errors import PolicyError
from modelswap_api.models import EffectivePolicyStatus
from modelswap_api.policy import EffectivePolicy, effective_policy


def older_defaults() -> dict[str, Any]:
    """Cluster defaults as a chart from before the bounds wrote them."""
    defaults = copy.deepcopy(dict(BUILTIN_DEFAULTS))
    defaults["gateway"] = {"maxQueued": 100, "queueTimeout": "60s"}
    return defaults


def test_the_builtin_bounds() -> None:
    policy = effective_policy({}, BUILTIN_DEFAULTS)
    assert policy.max_tokens == DEFAULT_MAX_TOKENS == 4096
    assert policy.max_prompt_bytes == DEFAULT_MAX_PROMPT_BYTES == 1 << 20


def test_spec_bounds_override_and_travel_in_the_status_in_bytes() -> None:
    policy = effective_policy(
        {"gateway": {"maxTokens": 64, "maxPromptBytes": "16Ki"}}, BUILTIN_DEFAULTS
    )
    assert (policy.max_tokens, policy.max_prompt_bytes) == (64, 16 << 10)
    status = policy.to_status().to_dict()
    assert status["maxTokens"] == 64 and status["maxPromptBytes"] == 16 << 10
    assert EffectivePolicy.from_status(policy.to_status()) == policy


def test_defaults_and_wire_policies_from_before_the_bounds_take_the_builtin_values() -> None:
    assert check_defaults(older_defaults())["gateway"]["maxTokens"] == DEFAULT_MAX_TOKENS
    policy = effective_policy({"gateway": {"maxTokens": 10}}, older_defaults())
    assert (policy.max_tokens, policy.max_prompt_bytes) == (10, DEFAULT_MAX_PROMPT_BYTES)
    wire = effective_policy({}, BUILTIN_DEFAULTS).to_status().to_dict()
    del wire["maxTokens"], wire["maxPromptBytes"]
    back = EffectivePolicy.from_status(EffectivePolicyStatus.from_dict(wire))
    assert (back.max_tokens, back.max_prompt_bytes) == (4096, 1 << 20)


@pytest.mark.parametrize(
    ("field", "value"),
    [("maxTokens", 0), ("maxTokens", 2**70), ("maxPromptBytes", 0), ("maxPromptBytes", -5)],
)
def test_a_wire_bound_out_of_range_is_refused_naming_it(field: str, value: int) -> None:
    wire = effective_policy({}, BUILTIN_DEFAULTS).to_status().to_dict()
    wire[field] = value
    with pytest.raises(PolicyError) as caught:
        EffectivePolicy.from_status(EffectivePolicyStatus.from_dict(wire))
    assert field in {e.path for e in caught.value.errors}
