"""A dropped model reloading its weights for requests in flight is not a victim (issue 26,
item 4): the agent's node view weighs it as a load under way, so the policy never hands it
to a swap-out (whose drain would wait for the very request that commits the weights). Idle,
it is weighed as resident and is a victim at once, as before (issue 12, finding 7)."""

from __future__ import annotations

import pytest

from modelswap_sidecar.agent.core.views import GpuBudget, node_view
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.admission import admit
from modelswap_sidecar.policy.decisions import AdmissionOutcome
from modelswap_sidecar.policy.inputs import NodeView, PolicySettings, Residency
from modelswap_sidecar.policy.swapouts import plan_swap_outs
from tests.unit.test_agent_planning import MIB, model, uid_of

GPU = [GpuBudget(ordinal=0, uuid="g0", budget_bytes=48 * MIB)]
NOW_SECONDS = 1000.0


def two_cold_models(classify_requests: int) -> NodeView:
    """`classify` (onSwapOut: drop) swapped in, its weights not committed yet (engine
    LOADING), with `classify_requests` in flight; `other` swapped out, needing its room."""
    classify = model(
        "classify", 0, Serving.LOADED, onSwapOut="drop", idleAfter="1s", minResident="1s"
    )
    classify.resident_since_seconds = NOW_SECONDS - 600
    classify.active_requests = classify_requests
    other = model("other", 0, Serving.LOADED)
    states = {classify.triton_name: EngineState.LOADING, other.triton_name: EngineState.DROPPED}
    return node_view([classify, other], states, GPU, NOW_SECONDS)


@pytest.mark.parametrize("waited_seconds", [0.0, 11.0, None])
def test_a_reload_with_requests_in_flight_is_never_a_victim(waited_seconds: float | None) -> None:
    node = two_cold_models(classify_requests=10)
    decision = admit(
        node, uid_of("other"), NOW_SECONDS, PolicySettings(), waited_seconds=waited_seconds
    )
    assert uid_of("classify") not in [v.uid for v in decision.victims], decision
    assert decision.outcome is AdmissionOutcome.WAIT and decision.reason == "WaitingForLoads"
    assert node.model(uid_of("classify")).residency is Residency.LOADING
    # nor does the idle or pressure rule take it
    assert plan_swap_outs(node, NOW_SECONDS, PolicySettings()) == ()


def test_an_idle_reload_is_still_a_victim_at_once() -> None:
    """A request that failed before the model ran loads nothing: the reload stalls, and
    its memory must not stay held (issue 12, finding 7)."""
    node = two_cold_models(classify_requests=0)
    assert node.model(uid_of("classify")).residency is Residency.RESIDENT
    decision = admit(node, uid_of("other"), NOW_SECONDS, PolicySettings(), waited_seconds=0.0)
    assert decision.outcome is AdmissionOutcome.ADMIT
    assert [v.uid for v in decision.victims] == [uid_of("classify")]
