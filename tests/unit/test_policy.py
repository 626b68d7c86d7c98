import copy
from typing import Any

import pytest

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.errors import PolicyError
from modelswap_api.policy import effective_policy


def defaults(**swap: Any) -> dict[str, Any]:
    merged = copy.deepcopy(dict(BUILTIN_DEFAULTS))
    merged["swapPolicy"].update(swap)
    return merged


def test_spec_fields_override_defaults_and_the_rest_are_filled_in() -> None:
    policy = effective_policy(
        {"swapPolicy": {"idleAfter": "30m", "priority": 7}, "kvCache": {"hostBytes": "2Gi"}},
        BUILTIN_DEFAULTS,
    )
    assert policy.idle_after.seconds == 1800
    assert policy.priority == 7
    assert policy.kv_host_bytes == 2 << 30
    assert policy.min_resident.raw == BUILTIN_DEFAULTS["swapPolicy"]["minResident"]
    assert policy.max_queued == BUILTIN_DEFAULTS["gateway"]["maxQueued"]
    status = policy.to_status().to_dict()
    assert status["idleAfter"] == "30m" and status["kvHostBytes"] == 2 << 30


def test_a_rule_broken_only_by_the_merge_names_both_fields_and_their_origins() -> None:
    with pytest.raises(PolicyError) as caught:
        effective_policy({"swapPolicy": {"minResident": "10m"}}, defaults(idleAfter="5m"))
    (error,) = caught.value.errors
    assert error.path == "spec.swapPolicy.minResident"
    assert 'minResident="10m" from spec.swapPolicy.minResident' in error.message
    assert 'idleAfter="5m" from cluster defaults swapPolicy.idleAfter' in error.message


def test_pinned_over_a_drop_default_is_refused() -> None:
    with pytest.raises(PolicyError) as caught:
        effective_policy({"swapPolicy": {"pinned": True}}, defaults(onSwapOut="drop"))
    assert [e.path for e in caught.value.errors] == ["spec.swapPolicy.onSwapOut"]
    assert "pinned=true from spec.swapPolicy.pinned" in caught.value.errors[0].message


def test_never_idle_admits_any_min_resident() -> None:
    policy = effective_policy({"swapPolicy": {"minResident": "10h"}}, defaults(idleAfter="never"))
    assert policy.idle_after.seconds is None


def test_incomplete_or_malformed_defaults_are_refused_naming_the_field() -> None:
    broken = defaults()
    del broken["gateway"]["queueTimeout"]
    broken["swapPolicy"]["idleAfter"] = "soon"
    with pytest.raises(PolicyError) as caught:
        effective_policy({}, broken)
    paths = {e.path for e in caught.value.errors}
    assert paths == {"defaults.gateway.queueTimeout", "defaults.swapPolicy.idleAfter"}
