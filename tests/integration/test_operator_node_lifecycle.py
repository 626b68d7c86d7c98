"""Ready means one thing, and a node's SwapNode follows its Lease (issue 27, items 5 and 6):
the API emulator, real agents (real Triton, sim GPUs) and the operator.

- Phase, the Ready condition and the EndpointSlice's `ready` agree through a drop, a
  swap-out and the loss of the node: Ready = a request sent now is answered (after a
  swap-in or a reload if needed), and a dropped or swapped-out model answers.
- `kubectl delete swapnode` of a healthy node moves nothing: its Lease is renewed, its
  agent creates the SwapNode again, every model stays where it is, loaded once.
- A dead node's SwapNode says so (the Lease column) and is deleted once its Lease has been
  stale for the operator's dead-node retention (seconds here; 10 minutes by default).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from modelswap_operator.status import SERVING_PHASES
from tests.integration.test_operator import (
    EXAMPLES,
    classify_through_service,
    stub_pids,
    wait_ready,
)
from tests.support.kube_testing import Kubectl, load_yaml
from tests.support.operator_world import GRACE_SECONDS, Objects, agents, emulator, operator
from tests.support.waiting import until

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]
#: A disagreement seen unchanged for this long is the operator's, not a read that fell
#: between its EndpointSlice write and its status write (one turn, milliseconds apart).
SETTLED_SECONDS = 1.0
#: A merge patch of nodeSelector that lets a model go to any node (the hostname key removed)
ANYWHERE = {"kubernetes.io/hostname": None, "pool": "sim"}


def classify_as(name: str, node: str, **swap_policy: Any) -> dict[str, Any]:
    """The classify example under `name`, on `node`, with `swap_policy` over its own."""
    body = load_yaml(EXAMPLES / "classify-drop-on-idle.yaml")
    body["metadata"]["name"] = name
    body["spec"]["placement"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    body["spec"]["swapPolicy"] = {**body["spec"]["swapPolicy"], **swap_policy}
    return body


@dataclass(frozen=True)
class Seen:
    """One model's phase, Ready status and EndpointSlice `ready` (None: no slice)."""

    phase: str | None
    ready: str | None
    slice_ready: bool | None

    @property
    def agrees(self) -> bool:
        """Ready and the slice say the same; a serving phase is Ready, any other unready
        but Loading (a model loading again, Ready before, stays Ready while it loads)."""
        ready = self.ready == "True"
        if ready != (self.slice_ready is True):
            return False
        if self.phase in SERVING_PHASES:
            return ready
        return self.phase == "Loading" or not ready


def seen(objects: Objects, name: str) -> Seen:
    status = (objects.get(name) or {}).get("status") or {}
    ready = next((c["status"] for c in status.get("conditions") or () if c["type"] == "Ready"),
                 None)  # fmt: skip
    try:
        endpoints = objects.endpoint_slice(name).endpoints or []
        slice_ready: bool | None = bool(endpoints and endpoints[0].conditions.ready)
    except client.ApiException as e:
        if e.status != 404:
            raise
        slice_ready = None
    return Seen(status.get("phase"), ready, slice_ready)


class Agreement:
    """Watches models in a thread: every disagreement of phase, Ready and the slice that
    stays unchanged for SETTLED_SECONDS is kept, with what each model went through."""

    def __init__(self, objects: Objects, names: tuple[str, ...]) -> None:
        self.objects, self.names = objects, names
        self.history: dict[str, list[Seen]] = {name: [] for name in names}
        self.disagreements: list[tuple[str, Seen]] = []
        self._stop = threading.Event()

    @contextmanager
    def watching(self) -> Iterator[Agreement]:
        thread = threading.Thread(target=self._run, name="agreement", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(10)

    def _run(self) -> None:
        since: dict[str, tuple[Seen, float]] = {}
        while not self._stop.is_set():
            for name in self.names:
                now_seen, now = seen(self.objects, name), time.monotonic()
                history = self.history[name]
                if not history or history[-1] != now_seen:
                    history.append(now_seen)
                first = since.get(name)
                if first is None or first[0] != now_seen:
                    since[name] = (now_seen, now)
                elif (
                    not now_seen.agrees
                    and now - first[1] >= SETTLED_SECONDS
                    and (name, now_seen) not in self.disagreements
                ):
                    self.disagreements.append((name, now_seen))
            self._stop.wait(0.05)

    def check(self) -> None:
        assert not self.disagreements, (self.disagreements, self.history)


async def settled(objects: Objects, name: str, want: Seen, what: str) -> None:
    await until(lambda: seen(objects, name) == want, f"{name} {what}: {want}", 30)


@pytest.mark.timeout(300)
async def test_phase_ready_and_the_slice_agree_through_drop_swap_out_and_node_loss(
    tmp_path: Path,
) -> None:
    with emulator() as api:
        objects = Objects(api)
        async with agents(api, tmp_path, names=("node-a", "node-b")) as nodes:
            with operator(api):
                idle = {"idleAfter": "1s", "minResident": "1s"}
                objects.apply(classify_as("dropper", "node-a", onSwapOut="drop", **idle))
                objects.apply(classify_as("swapper", "node-a", onSwapOut="host", **idle))
                objects.apply(classify_as("mover", "node-a", idleAfter="never"))
                for name in ("dropper", "swapper", "mover"):
                    await wait_ready(objects, name)
                # The mover may go anywhere now: it stays on node-a until node-a is lost.
                objects.patch("mover", {"spec": {"placement": {"nodeSelector": ANYWHERE}}})
                agreement = Agreement(objects, ("dropper", "swapper", "mover"))
                with agreement.watching():
                    # Dropped: the node holds nothing, yet a request is answered (it loads
                    # the model again): Ready, and so is its endpoint.
                    await settled(objects, "dropper", Seen("Dropped", "True", True), "dropped")
                    assert objects.condition("dropper", "Loaded")["reason"] == "Dropped"
                    await classify_through_service(objects, "dropper")
                    # Swapped out to host memory: a request swaps it in.
                    await settled(
                        objects, "swapper", Seen("SwappedOut", "True", True), "swapped out"
                    )
                    await classify_through_service(objects, "swapper")
                    await settled(objects, "mover", Seen("Resident", "True", True), "resident")

                    # node-a is lost: nothing it reported is vouched for any more. The
                    # mover comes up on node-b; the others can live only on node-a.
                    await nodes["node-a"].agent.stop()
                    await until(lambda: (
                        (o := objects.get("mover")) and o["status"].get("node") == "node-b"
                    ), "the mover placed on node-b", 30)  # fmt: skip
                    await settled(objects, "mover", Seen("Resident", "True", True), "on node-b")
                    await classify_through_service(objects, "mover")
                    for name in ("dropper", "swapper"):
                        await settled(objects, name, Seen("Pending", "False", None), "unplaced")
                # Throughout, no model was shown Resident (or Dropped, or SwappedOut) and
                # unready, nor Ready with an unready endpoint, nor the other way round.
                agreement.check()
        objects.close()


@pytest.mark.timeout(300)
async def test_deleting_a_healthy_nodes_swapnode_moves_nothing(tmp_path: Path) -> None:
    with emulator() as api:
        objects = Objects(api)
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        # The agent looks at its SwapNode every 3 s: for that long it is gone.
        async with agents(api, tmp_path, names=("node-a", "node-b"),
                          kube_settings={"nodeRefreshSeconds": 3}) as nodes:  # fmt: skip
            with operator(api):
                free = classify_as("free", "node-a", idleAfter="never")
                pinned = classify_as(
                    "pinned", "node-a", idleAfter="never", pinned=True, onSwapOut="host"
                )
                objects.apply(free)
                objects.apply(pinned)
                before = {name: await wait_ready(objects, name) for name in ("free", "pinned")}
                pids = {name: stub_pids(nodes, obj) for name, obj in before.items()}
                # Either may move anywhere as far as placement goes.
                for name in before:
                    objects.patch(name, {"spec": {"placement": {"nodeSelector": ANYWHERE}}})
                old_uid = objects.custom.get_cluster_custom_object(
                    "modelswap.io", "v1alpha1", "swapnodes", "node-a"
                )["metadata"]["uid"]

                kubectl.run("delete", "swapnode", "node-a", check=True)
                deleted_at = time.monotonic()

                def recreated() -> dict[str, Any] | None:
                    try:
                        found: dict[str, Any] = objects.custom.get_cluster_custom_object(
                            "modelswap.io", "v1alpha1", "swapnodes", "node-a"
                        )
                    except client.ApiException:
                        return None
                    fresh = found["metadata"]["uid"] != old_uid
                    return found if fresh and (found.get("status") or {}).get("endpoint") else None

                # Meanwhile and after, every model stays Ready where it was.
                while time.monotonic() - deleted_at < 3 + 2 * GRACE_SECONDS:
                    for name in before:
                        obj = objects.get(name) or {}
                        assert obj["status"]["node"] == "node-a", obj["status"]
                        assert objects.condition(name, "Ready")["status"] == "True", obj["status"]
                    await asyncio.sleep(0.2)
                swapnode = await until(recreated, "node-a's agent to create its SwapNode again")
                assert swapnode["metadata"]["labels"]["modelswap.io/lease"] == "Live"
                for name, obj in before.items():
                    assert stub_pids(nodes, obj) == pids[name]  # never loaded again
                    await classify_through_service(objects, name)
                assert await nodes["node-b"].control.models() == {}  # nothing went there
        objects.close()


@pytest.mark.timeout(240)
async def test_a_dead_nodes_swapnode_is_labelled_expired_then_collected(tmp_path: Path) -> None:
    retention_seconds = 4.0
    with emulator() as api:
        objects = Objects(api)
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        async with agents(api, tmp_path, names=("node-a", "node-b")) as nodes:
            with operator(api, dead_node_retention_seconds=retention_seconds):

                def lease_column() -> dict[str, str]:
                    table = kubectl.run("get", "swapnodes", check=True).stdout.splitlines()
                    header = table[0].split()
                    return {row.split()[0]: row.split()[header.index("LEASE")] for row in table[1:]}

                await until(lambda: lease_column() == {"node-a": "Live", "node-b": "Live"},
                            "both SwapNodes labelled Live")  # fmt: skip
                await nodes["node-b"].agent.stop()
                stopped_at = time.monotonic()
                await until(lambda: lease_column().get("node-b") == "Expired",
                            "node-b's SwapNode labelled Expired", 30)  # fmt: skip
                assert lease_column()["node-a"] == "Live"

                def gone() -> bool:
                    try:
                        objects.custom.get_cluster_custom_object(
                            "modelswap.io", "v1alpha1", "swapnodes", "node-b"
                        )
                    except client.ApiException as e:
                        return e.status == 404
                    return False

                await until(gone, "node-b's SwapNode deleted", 60)
                # Not before its Lease was stale (grace) and the retention had passed.
                assert time.monotonic() - stopped_at >= GRACE_SECONDS + retention_seconds - 2.1
                assert lease_column() == {"node-a": "Live"}
        objects.close()
