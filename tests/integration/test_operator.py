"""The operator end to end: the API emulator, three real agents (real Triton, sim GPUs) and
the operator under KopfRunner. What a user does — `kubectl apply`, edit, delete, a node
that dies — and what they see: status, Events, and answers through the model's Service."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest

from examples.models import reference
from tests.support.kube_testing import REPO_ROOT, Kubectl, load_yaml
from tests.support.operator_world import Objects, agents, emulator, operator

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]
T = TypeVar("T")
EXAMPLES = REPO_ROOT / "examples"


async def until(probe: Callable[[], T], what: str, timeout_seconds: float = 60.0) -> T:
    """Poll a blocking probe (off the loop) until it answers something truthy."""
    deadline = time.monotonic() + timeout_seconds
    last: Any = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(probe)
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def ready(objects: Objects, name: str, namespace: str = "default") -> dict[str, Any] | None:
    if objects.condition(name, "Ready", namespace).get("status") == "True":
        return objects.get(name, namespace)
    return None


async def wait_ready(objects: Objects, name: str, namespace: str = "default") -> dict[str, Any]:
    try:
        return await until(lambda: ready(objects, name, namespace), f"{namespace}/{name} Ready")
    except AssertionError as e:
        status = (objects.get(name, namespace) or {}).get("status")
        raise AssertionError(f"{e}; status: {status}") from None


async def classify_through_service(objects: Objects, name: str, namespace: str = "default") -> None:
    """A request to the address the EndpointSlice gives, with the Service's Host header, is
    answered as the reference model answers."""
    endpoint_slice = objects.endpoint_slice(name, namespace)
    address = endpoint_slice.endpoints[0].addresses[0]
    port = endpoint_slice.ports[0].port
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
        response = await http.post(
            f"http://{address}:{port}/v2/models/classify/infer",
            json=reference.mlp_infer_body(x),
            headers={"Host": f"{name}.{namespace}.svc"},
        )
    assert response.status_code == 200, response.text
    output = next(o for o in response.json()["outputs"] if o["name"] == "OUTPUT0")
    expected = reference.mlp_forward(x)
    assert np.allclose(np.array(output["data"]).reshape(expected.shape), expected, atol=1e-4)


@pytest.mark.timeout(300)
async def test_apply_edit_delete_and_node_loss(tmp_path: Path) -> None:
    with emulator() as api:
        objects = Objects(api)
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        async with agents(api, tmp_path) as nodes:
            with operator(api):
                # kubectl apply the examples: each is placed, loaded, routed and Ready.
                kubectl.run("apply", "-f", str(EXAMPLES), check=True)
                for name in ("classify", "summarize", "chat-pinned"):
                    obj = await wait_ready(objects, name)
                    status = obj["status"]
                    assert status["node"] in nodes and status["gpu"].startswith(status["node"])
                    assert status["endpoint"] == f"{name}.default.svc"
                    assert status["observedGeneration"] == 1
                    assert (
                        status["effectivePolicy"]["priority"]
                        == obj["spec"]["swapPolicy"]["priority"]
                    )
                    conditions = {c["type"]: c["status"] for c in status["conditions"]}
                    assert conditions == {"PolicyValid": "True", "Placed": "True",
                                          "Loaded": "True", "Ready": "True"}  # fmt: skip
                await classify_through_service(objects, "classify")

                # kubectl get md: model, node, phase, ready, resident, last request.
                table = kubectl.run("get", "md", check=True).stdout
                header = table.splitlines()[0].split()
                for column in ("MODEL", "NODE", "PHASE", "READY", "RESIDENT", "LAST-REQUEST"):
                    assert column in header, table
                assert "classify" in table and "True" in table

                # kubectl edit idleAfter: the agent swaps the model out on the new schedule.
                objects.patch("classify", {"spec": {"swapPolicy": {"idleAfter": "1s",
                                                                   "minResident": "1s",
                                                                   "onSwapOut": "host"}}})  # fmt: skip
                await until(
                    lambda: (
                        (objects.get("classify") or {}).get("status", {}).get("phase")
                        == "SwappedOut"
                    ),
                    "classify swapped out after the edit",
                )
                assert objects.get("classify")["status"]["observedGeneration"] == 2  # type: ignore[index]
                await classify_through_service(objects, "classify")  # swaps back in to answer

                # kubectl delete: memory freed on the node, then the object goes.
                chat = objects.get("chat-pinned")
                assert chat is not None
                chat_uid, chat_node = chat["metadata"]["uid"], chat["status"]["node"]
                kubectl.run("delete", "md", "chat-pinned", "--wait=false", check=True)
                await until(lambda: objects.get("chat-pinned") is None, "chat-pinned gone")
                held = await nodes[chat_node].control.models()
                assert chat_uid not in held

                # Stop the agent hosting classify: its Lease goes stale, classify moves.
                before = objects.get("classify")
                assert before is not None
                lost = before["status"]["node"]
                await nodes[lost].agent.stop()
                moved = await until(
                    lambda: (o := ready(objects, "classify")) and o["status"]["node"] != lost and o,
                    "classify Ready on another node",
                )
                assert objects.condition("classify", "Placed")["reason"] == "NodeLost"
                events = objects.events("classify")
                assert any(reason == "NodeLost" for reason, _ in events), events
                await classify_through_service(objects, "classify")
                assert moved["status"]["node"] != lost
        objects.close()


@pytest.mark.timeout(180)
async def test_too_large_is_not_placed_and_names_the_field(tmp_path: Path) -> None:
    with emulator() as api:
        objects = Objects(api)
        async with agents(api, tmp_path, names=("node-a",)):
            with operator(api):
                huge = load_yaml(EXAMPLES / "classify-drop-on-idle.yaml")
                huge["metadata"]["name"] = "huge"
                huge["spec"]["model"]["weightsBytes"] = "64Gi"
                objects.apply(huge)
                objects.apply(load_yaml(EXAMPLES / "classify-drop-on-idle.yaml"))
                await wait_ready(objects, "classify")
                placed = await until(
                    lambda: (
                        objects.condition("huge", "Placed").get("reason") == "ExceedsGpuBudget"
                        and objects.condition("huge", "Placed")
                    ),
                    "huge refused for its size",
                )
                assert placed["status"] == "False"
                assert "spec.model.weightsBytes" in placed["message"], placed
                assert objects.get("huge")["status"]["phase"] == "Pending"  # type: ignore[index]
                assert any(reason == placed["reason"] for reason, _ in objects.events("huge"))
        objects.close()
