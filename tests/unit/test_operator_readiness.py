"""One meaning of Ready (issue 27, item 5) and a node's SwapNode kept to its Lease (item 6),
in the operator's pure parts: Ready = a request sent now is answered (after a swap-in or
a reload if needed); the phase says Unknown while the node cannot vouch for its report;
the EndpointSlice's `ready` is `serves`, the same rule less the routing. A deleted
SwapNode is remembered while its node's Lease is fresh."""

from __future__ import annotations

from typing import Any

import pytest

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import HostedModel
from modelswap_api.policy import effective_policy
from modelswap_operator.cache import Cache
from modelswap_operator.reading import lost_since
from modelswap_operator.status import Observed, Verdict, build_status, serves

POLICY = effective_policy(
    {"model": {"source": {"uri": "/models/mlp"}, "weightsBytes": "32Mi"}}, BUILTIN_DEFAULTS
)
NOW = "2026-11-27T15:00:00Z"
PLACED = Verdict(node="n1", gpu="g0", policy=POLICY, reason="Placed")


def status_of(observed: Observed, verdict: Verdict = PLACED) -> dict[str, Any]:
    return build_status(generation=1, deleting=False, verdict=verdict, observed=observed,
                        previous=None, now=NOW)  # fmt: skip


def condition(status: dict[str, Any], kind: str) -> tuple[str, str]:
    found = next(c for c in status["conditions"] if c["type"] == kind)
    return found["status"], found["reason"]


def hosted(state: str) -> HostedModel:
    return HostedModel(uid="u", state=state)  # type: ignore[arg-type]


def routed(state: str, **fields: Any) -> Observed:
    base: dict[str, Any] = {"node_live": True, "hosted": hosted(state), "routed": True,
                            "endpoint": "m.default.svc"}  # fmt: skip
    return Observed(**(base | fields))


@pytest.mark.parametrize(
    ("state", "ready"),
    [
        ("Resident", True),
        ("SwappedOut", True),  # the request swaps it in
        ("SwappingIn", True),
        ("SwappingOut", True),
        ("Dropped", True),  # the request loads it again from its source
        ("Loading", False),
        ("Failed", False),
    ],
)
def test_ready_is_whether_a_request_sent_now_is_answered(state: str, ready: bool) -> None:
    observed = routed(state)
    status = status_of(observed)
    assert condition(status, "Ready")[0] == ("True" if ready else "False"), status
    assert status["phase"] == state
    assert serves(PLACED, observed) is ready  # the EndpointSlice says the same


def test_a_dropped_model_is_not_loaded_but_ready() -> None:
    status = status_of(routed("Dropped"))
    assert condition(status, "Loaded") == ("False", "Dropped")  # no longer "Loading"
    assert condition(status, "Ready") == ("True", "Serving")


def test_a_dropped_model_whose_source_is_gone_is_not_ready() -> None:
    verdict = Verdict(node="n1", gpu="g0", policy=POLICY, source_problem="the Secret is gone")
    observed = routed("Dropped")
    assert condition(status_of(observed, verdict), "Ready")[0] == "False"
    assert not serves(verdict, observed)  # a reload would fail


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"node_live": False}, "NodeLost"),
        ({"agent_error": "GET /v1/node on node n1: connection refused"}, "AgentUnavailable"),
    ],
)
def test_a_node_that_cannot_vouch_makes_the_phase_unknown(
    fields: dict[str, Any], reason: str
) -> None:
    observed = routed("Resident", **fields)  # its last report still says Resident
    status = status_of(observed)
    assert status["phase"] == "Unknown" and status["node"] == "n1"
    assert condition(status, "Ready") == ("False", reason)
    assert not serves(PLACED, observed)


def test_not_routed_is_unready_yet_serves() -> None:
    observed = routed("Resident", routed=False)
    assert condition(status_of(observed), "Ready") == ("False", "NotRouted")
    assert serves(PLACED, observed)  # the slice is ready as soon as it is written


def test_lost_since_is_the_last_renewal_plus_the_grace() -> None:
    lease = {"spec": {"renewTime": "2026-11-27T15:00:00.000000Z"}}
    renewed = lost_since(lease, 0)
    assert renewed is not None and lost_since(lease, 90) == renewed + 90
    assert lost_since({"spec": {}}, 90) is None and lost_since(None, 90) is None


def swapnode(version: int, *, status: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": "n1", "resourceVersion": str(version)}}
    if status:
        body["status"] = {"endpoint": f"https://n1:{version}", "gpus": [{"uuid": "g0"}]}
    return body


def test_a_deleted_swapnode_is_remembered_and_stands_in_for_its_recreation() -> None:
    cache = Cache()
    cache.complete_swapnodes([swapnode(1)])
    cache.drop_swapnode("n1")
    snap = cache.snapshot()
    assert "n1" not in snap.swapnodes and snap.departed["n1"]["status"]["endpoint"]

    # Its agent creates it again: the new object has no status yet; the old status stands.
    cache.put_swapnode(swapnode(5, status=False))
    snap = cache.snapshot()
    assert snap.swapnodes["n1"]["metadata"]["resourceVersion"] == "5"
    assert snap.swapnodes["n1"]["status"]["endpoint"] == "https://n1:1"
    assert "n1" not in snap.departed

    cache.put_swapnode(swapnode(6))  # its agent's own status
    assert cache.snapshot().swapnodes["n1"]["status"]["endpoint"] == "https://n1:6"


def test_a_departed_swapnode_is_forgotten_on_request() -> None:
    cache = Cache()
    cache.complete_swapnodes([swapnode(1)])
    cache.drop_swapnode("n1")
    cache.forget_departed(["n1"])
    assert cache.snapshot().departed == {}
    cache.put_swapnode(swapnode(7, status=False))  # a new node of that name: nothing to lend
    assert "status" not in cache.snapshot().swapnodes["n1"]


def test_the_unknown_phase_is_a_valid_status_phase() -> None:
    from modelswap_api.errors import ContractError
    from modelswap_api.models import ModelDeploymentStatus

    assert ModelDeploymentStatus.from_dict({"phase": "Unknown"}).phase == "Unknown"
    with pytest.raises(ContractError):
        ModelDeploymentStatus.from_dict({"phase": "Lost"})
