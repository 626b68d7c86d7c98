"""The status fields `kubectl get` shows (issue 27, item 8): sizes as quantities, the
model's name, swap counters kept across moves, the SwapNode's summaries, and Events kept
out of a terminating namespace."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest

from modelswap_api import kube
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import GpuStatus, HostedModel
from modelswap_api.policy import effective_policy
from modelswap_api.quantities import format_bytes, parse_bytes
from modelswap_operator.events import TERMINATING_QUIET_SECONDS, EventRecorder
from modelswap_operator.handlers import wait_for_release
from modelswap_operator.status import Observed, Verdict, build_status
from modelswap_sidecar.heartbeat.objects import NodeFacts, desired_status
from modelswap_sidecar.heartbeat.report import NodeReport

UID = "5b0c2e0a-1d7e-4a3c-9f7e-2a4e0c1b9d11"
NOW = "2026-11-27T15:00:00Z"
POLICY = effective_policy(
    {"model": {"source": {"uri": "/models/mlp"}, "weightsBytes": "32Mi"}}, BUILTIN_DEFAULTS
)
INVOLVED = {
    "apiVersion": "modelswap.io/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": {"name": "classify", "namespace": "team-gone", "uid": UID},
}
TERMINATING = (
    'events "classify.1" is forbidden: unable to create new content in namespace team-gone '
    "because it is being terminated"
)


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (0, "0"),
        (999, "999"),
        (1024, "1Ki"),
        (1536, "1.5Ki"),
        (512 << 20, "512Mi"),
        (int(14.25 * (1 << 30)), "14.2Gi"),  # rounded down: never more than there is
        (120 << 30, "120Gi"),
        ((1 << 30) - 1, "1023Mi"),
        (3 << 40, "3Ti"),
    ],
)
def test_sizes_are_quantities_people_read(count: int, shown: str) -> None:
    assert format_bytes(count) == shown
    if count and "." not in shown:  # the CRD's spec quantities have no fractions or zero
        assert parse_bytes(shown) <= count


def status_on(node: str, swap_ins: int | None, previous: dict[str, Any] | None) -> dict[str, Any]:
    hosted = None
    if swap_ins is not None:
        hosted = HostedModel(uid=UID, state="Resident", resident_bytes=48 << 20,
                             host_bytes=3 << 29, swap_ins=swap_ins, swap_outs=swap_ins)  # fmt: skip
    return build_status(
        model_name="classify",
        generation=1,
        deleting=False,
        verdict=Verdict(node=node, gpu=f"{node}-gpu-0", policy=POLICY, reason="Placed"),
        observed=Observed(node_live=True, hosted=hosted, routed=True, endpoint="e"),
        previous=previous,
        now=NOW,
    )


def test_status_shows_the_model_name_and_sizes() -> None:
    status = status_on("node-a", 1, None)
    assert status["modelName"] == "classify"
    assert (status["residentBytes"], status["residentSize"]) == (48 << 20, "48Mi")
    assert (status["hostBytes"], status["hostSize"]) == (3 << 29, "1.5Gi")
    unplaced = build_status(generation=1, deleting=False, verdict=Verdict(reason="Pending"),
                            observed=Observed(), previous=None, now=NOW,
                            model_name="m")  # fmt: skip
    assert (unplaced["modelName"], unplaced["residentSize"], unplaced["hostSize"]) == (
        "m",
        "0",
        "0",
    )


def test_swap_counts_are_kept_when_the_model_moves() -> None:
    on_a = status_on("node-a", 3, None)
    assert (on_a["swapIns"], on_a.get("earlierSwapIns")) == (3, None)
    on_a = status_on("node-a", 5, on_a)
    assert on_a["swapIns"] == 5
    # Moved to node-b, which does not report it yet: node-a's 5 are kept.
    moved = status_on("node-b", None, on_a)
    assert (moved["swapIns"], moved["earlierSwapIns"], moved["swapOuts"]) == (5, 5, 5)
    on_b = status_on("node-b", 0, moved)
    assert on_b["swapIns"] == 5
    on_b = status_on("node-b", 2, on_b)
    assert (on_b["swapIns"], on_b["earlierSwapIns"]) == (7, 5)
    # A turn without node-b's report changes nothing; its agent restarting (counting from
    # 0 again) keeps what it had counted.
    assert status_on("node-b", None, on_b)["swapIns"] == 7
    restarted = status_on("node-b", 1, on_b)
    assert (restarted["swapIns"], restarted["earlierSwapIns"]) == (8, 7)
    # Unplaced (node lost, no room elsewhere), then placed on node-c: nothing lost.
    nowhere = build_status(generation=1, deleting=False, verdict=Verdict(reason="NoRoom"),
                           observed=Observed(), previous=restarted, now=NOW)  # fmt: skip
    assert nowhere["swapIns"] == 8
    assert status_on("node-c", 1, nowhere)["swapIns"] == 9


def test_the_swapnode_status_carries_the_summaries_its_columns_show() -> None:
    gpus = tuple(
        GpuStatus(uuid=f"g{i}", ordinal=i, hbm_free_bytes=free)
        for i, free in enumerate((10 << 30, 5 << 29))
    )
    models = (
        HostedModel(uid="a", desired=True),
        HostedModel(uid="b"),
        HostedModel(uid="c", desired=False),  # dropped, host bytes kept: not hosted
    )
    report = NodeReport(agent_version="1", gpus=gpus, models=models)
    status = desired_status(report, NodeFacts(name="n", uid="u", labels={}, taints=()))
    assert status["gpuCount"] == 2
    assert (status["hbmFreeBytes"], status["hbmFreeSize"]) == (25 << 29, "12.5Gi")
    assert status["modelCount"] == 2


class Refusing:
    """`KubeIO.call` for Events in a namespace being deleted: every create is refused as
    the API server refuses it; the calls are counted."""

    def __init__(self) -> None:
        self.calls = 0
        self.message = TERMINATING

    async def call(self, helper: Callable[..., Any], namespace: str, *args: Any) -> Any:
        self.calls += 1
        raise kube.KubeError(f"create Event: 403 Forbidden: {self.message}", status=403,
                             reason="Forbidden")  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 27, 15, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.mark.asyncio
async def test_a_terminating_namespace_gets_one_refused_post_and_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    io, clock = Refusing(), Clock()
    recorder = EventRecorder(io, clock=clock)  # type: ignore[arg-type]
    for i in range(50):
        await recorder.post(INVOLVED, "Normal", "Deleting", f"Ready=False: being deleted {i}")
    assert io.calls == 1
    assert recorder.terminating("team-gone") and not recorder.terminating("team-a")
    mine = [r for r in caplog.records if r.name == "modelswap_operator.events"]
    assert [r for r in mine if r.levelname in ("WARNING", "ERROR")] == []
    # Another refusal is still a warning; and the namespace is asked again later (one
    # created again under the same name gets its Events).
    clock.now += timedelta(seconds=TERMINATING_QUIET_SECONDS + 1)
    io.message = "events is forbidden: User cannot create resource"
    await recorder.post(INVOLVED, "Normal", "Deleting", "Ready=False: being deleted")
    assert io.calls == 2 and not recorder.terminating("team-gone")
    mine = [r for r in caplog.records if r.name == "modelswap_operator.events"]
    assert [r.levelname for r in mine if r.levelname == "WARNING"] == ["WARNING"]


class Releasing:
    """The runtime as the deletion handler sees it: the model is released after
    `waits` waits; `terminating` says whether its namespace refused an Event."""

    def __init__(self, waits: int, terminating: bool) -> None:
        self.waits, self.calls, self.terminating = waits, 0, terminating

    async def wait_released(self, uid: str, timeout_seconds: float) -> bool:
        self.calls += 1
        return self.calls > self.waits

    def namespace_terminating(self, namespace: str) -> bool:
        return self.terminating and namespace == "team-gone"


@pytest.mark.asyncio
async def test_the_finalizer_waits_quietly_in_a_terminating_namespace() -> None:
    terminating = Releasing(waits=3, terminating=True)
    await wait_for_release(terminating, UID, "classify", "team-gone")  # type: ignore[arg-type]
    assert terminating.calls == 4  # waited on, no kopf retry (no error line, no Event)
    elsewhere = Releasing(waits=3, terminating=False)
    with pytest.raises(kopf.TemporaryError, match="team-gone/classify"):
        await wait_for_release(elsewhere, UID, "classify", "team-gone")  # type: ignore[arg-type]
    assert elsewhere.calls == 1


@pytest.mark.asyncio
async def test_models_deleted_together_cost_a_terminating_namespace_one_refused_post() -> None:
    io = Refusing()
    recorder = EventRecorder(io, clock=Clock())  # type: ignore[arg-type]
    deleting = {
        **INVOLVED,
        "metadata": {**INVOLVED["metadata"], "deletionTimestamp": "2026-11-27T15:00:00Z"},
    }
    notes = [
        recorder.post(deleting, "Warning", "AgentUnavailable", f"Ready=False: {i}")
        for i in range(20)
    ]
    await asyncio.gather(*notes)  # side by side, as the loop's status writes post them
    assert io.calls == 1
