"""A model's last-request mark, which the policy's idle time and victim ranking read
(docs/POLICY.md): the gateway's records of a request (its receipt and its answer) and
Triton's `last_inference` each move it forward, and nothing moves it back."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from modelswap_api.control import DesiredEntry
from modelswap_api.policy import EffectivePolicy
from modelswap_sidecar.agent.core.loops import PolicyLoop
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.ports.gateway_directory import AgentDirectory
from modelswap_sidecar.triton.driver import ModelStatistics
from tests.support.agent_harness import entry, new_uid


class Clocks:
    """A monotonic and a wall clock 1,000 s apart that move together."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + 1000.0


def model() -> AgentModel:
    e = DesiredEntry.from_dict(entry(new_uid(), name="m"))
    return AgentModel(entry=e, policy=EffectivePolicy.from_status(e.policy))


def actuator(m: AgentModel, clocks: Clocks) -> Any:
    return SimpleNamespace(records={m.uid: m}, clock=clocks.monotonic)


def stats(m: AgentModel, last_wall_seconds: float) -> ModelStatistics:
    return ModelStatistics(
        uid=m.uid,
        triton_name="m",
        last_inference_seconds=last_wall_seconds,
        inference_count=1,
        execution_count=1,
        success_count=1,
        fail_count=0,
    )


def test_an_older_triton_last_inference_does_not_move_the_mark_back() -> None:
    clocks, m = Clocks(), model()
    act = actuator(m, clocks)
    d = AgentDirectory(act, clock=clocks.monotonic, wall_clock=clocks.wall)
    loop = PolicyLoop(act, driver=None, interval_seconds=1, metrics=None, wall_clock=clocks.wall)  # type: ignore[arg-type]
    clocks.now = 110.0
    d.record_request(m.uid, clocks.wall())  # the gateway's answer at 1110 (wall)
    clocks.now = 111.0
    loop.observe_requests({m.uid: stats(m, 1109.998)})  # Triton's own end of it, a bit earlier
    assert m.last_request_wall_seconds == 1110.0 and m.last_request_seconds == 110.0
    loop.observe_requests({m.uid: stats(m, 1110.7)})  # traffic that bypassed the gateway
    assert m.last_request_wall_seconds == 1110.7
    assert abs(m.last_request_seconds - 110.7) < 1e-9
