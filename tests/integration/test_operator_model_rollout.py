"""A changed `spec.model` rolls out (issue 27, item 2): the API emulator, a real agent (real
Triton, sim GPUs) and the operator.

The example MLP answers a CHECKSUM of its weights region, whose size is
`spec.model.weightsBytes`: two sizes are two models that answer differently, so a request
says which one served it.

- With room on the GPU for both: the new model generation loads beside the old one, which
  answers every request meanwhile; once the new one answers the route switches to it, the
  old instance is released (gone from Triton), the status says which model generation
  serves, and `RolledOut` went False (`RollingOut`) and back to True, with Events.
- A `source` edit to another model (the language model behind the MLP's name): the new
  one answers under the same name and the old one is released.
- Without room for both: the old instance is released first, a Warning Event
  `RolloutInterrupts` says so, requests meanwhile wait (or are answered 503 with
  Retry-After, never a 404 or a wrong answer), and the new model then serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from examples.models import reference
from modelswap_sidecar.agent.core.instances import instance_key
from modelswap_sidecar.triton.naming import triton_model_name
from tests.integration.test_operator import wait_ready
from tests.integration.test_operator_day2 import classify_on
from tests.support.agent_harness import MIB, Node
from tests.support.operator_world import Objects, agents, emulator, operator
from tests.support.service_calls import slice_address, tinylm_completes
from tests.support.waiting import until, until_async

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def checksum_through_service(address: str, port: int, host: str) -> httpx.Response:
    x = reference.mlp_input(3)
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
        return await http.post(
            f"http://{address}:{port}/v2/models/classify/infer",
            json=reference.mlp_infer_body(x),
            headers={"Host": host},
        )


def checksum_of(response: httpx.Response) -> int:
    """The CHECKSUM a 200 answer carries (its OUTPUT0 checked against the reference)."""
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    x = reference.mlp_input(3)
    expected = reference.mlp_forward(x)
    output = np.array(outputs["OUTPUT0"]["data"], dtype=np.float32).reshape(expected.shape)
    assert np.allclose(output, expected, atol=1e-4)
    return int(outputs["CHECKSUM"]["data"][0])


class Traffic:
    """Requests to the Service, one after another, each answer kept (status, checksum)."""

    def __init__(self, address: str, port: int, host: str) -> None:
        self.target = (address, port, host)
        self.answers: list[tuple[int, int | None, str]] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            response = await checksum_through_service(*self.target)
            if response.status_code == 200:
                self.answers.append((200, checksum_of(response), ""))
            else:
                retry = response.headers.get("retry-after", "")
                self.answers.append((response.status_code, None, retry + " " + response.text))
            await asyncio.sleep(0.02)

    def __enter__(self) -> Traffic:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def triton_serves(node: Node, triton_name: str) -> bool:
    """Triton's repository index says `triton_name` is READY."""
    async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
        response = await http.post(f"http://{node.triton.url}/v2/repository/index", json={})
    response.raise_for_status()
    return any(m["name"] == triton_name and m.get("state") == "READY" for m in response.json())


def events_of(objects: Objects, name: str) -> list[Any]:
    return list(
        objects.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={name}"
        ).items
    )


def classify_sized(weights: str) -> dict[str, Any]:
    body = classify_on("classify", "node-a")
    body["spec"]["model"]["weightsBytes"] = weights
    return body


@pytest.mark.timeout(300)
async def test_a_weights_edit_rolls_out_beside_the_old_model_and_releases_it(
    tmp_path: Path,
) -> None:
    with emulator() as api:
        objects = Objects(api)
        async with agents(api, tmp_path, names=("node-a",)) as nodes:
            with operator(api):
                objects.apply(classify_sized("32Mi"))
                first = await wait_ready(objects, "classify")
                uid = first["metadata"]["uid"]
                assert first["status"]["modelGeneration"] == 1
                assert first["status"]["servingModelGeneration"] == 1
                address, port = slice_address(objects.endpoint_slice("classify"))
                host = "classify.default.svc"
                old_sum, new_sum = (
                    reference.mlp_checksum(32 * MIB),
                    reference.mlp_checksum(48 * MIB),
                )
                assert old_sum != new_sum
                assert checksum_of(await checksum_through_service(address, port, host)) == old_sum

                with Traffic(address, port, host) as traffic:
                    objects.patch("classify", {"spec": {"model": {"weightsBytes": "48Mi"}}})
                    edited = int(objects.get("classify")["metadata"]["generation"])
                    assert edited == 2

                    def rolled_out() -> dict[str, Any] | None:
                        status = (objects.get("classify") or {}).get("status") or {}
                        done = status.get("servingModelGeneration") == edited
                        return (
                            status
                            if done and any(a[1] == new_sum for a in traffic.answers)
                            else None
                        )

                    status = await until(rolled_out, "model generation 2 serving", 120)
                    # a few more answers after the switch: the new model's, every one
                    seen = len(traffic.answers)
                    await until(lambda: len(traffic.answers) > seen + 5, "answers after it", 30)
                    await traffic.stop()
                answers = traffic.answers
                assert answers, "no request was answered"
                # Every request was answered 200, the old model's until the switch, then
                # the new one's: never a refusal, never the old one after the new.
                assert {a[0] for a in answers} == {200}, [a for a in answers if a[0] != 200][:3]
                sums = [a[1] for a in answers]
                switch = sums.index(new_sum)
                assert set(sums[:switch]) <= {old_sum} and set(sums[switch:]) == {new_sum}, sums
                assert status["modelGeneration"] == 2 and status["observedGeneration"] == 2
                ready = objects.condition("classify", "Ready")
                assert ready["status"] == "True", ready
                # The old instance is released: out of Triton, and the agent reports the one
                # model generation.
                node = nodes["node-a"]
                new_name = triton_model_name(instance_key(uid, 2))
                assert await triton_serves(node, new_name)
                await until(
                    lambda: objects.condition("classify", "RolledOut").get("status") == "True",
                    "RolledOut=True",
                )

                async def old_released() -> bool:
                    return not await triton_serves(node, triton_model_name(uid))

                await until_async(old_released, "the old instance out of Triton", 60)
                held = await node.control.model(uid)
                assert held["modelGeneration"] == 2 and held["phase"] == "Resident", held
                reasons = [(e.reason, e.type) for e in events_of(objects, "classify")]
                assert ("RollingOut", "Normal") in reasons, reasons
                assert ("Current", "Normal") in reasons, reasons
        objects.close()


@pytest.mark.timeout(300)
async def test_a_weights_edit_without_room_for_both_interrupts_with_an_event(
    tmp_path: Path,
) -> None:
    with emulator() as api:
        objects = Objects(api)
        async with agents(api, tmp_path, names=("node-a",)) as nodes:
            with operator(api):
                objects.apply(classify_sized("160Mi"))
                first = await wait_ready(objects, "classify")
                uid = first["metadata"]["uid"]
                address, port = slice_address(objects.endpoint_slice("classify"))
                host = "classify.default.svc"
                new_sum = reference.mlp_checksum(200 * MIB)
                assert checksum_of(
                    await checksum_through_service(address, port, host)
                ) == reference.mlp_checksum(160 * MIB)

                with Traffic(address, port, host) as traffic:
                    # 160Mi + 200Mi do not fit one 256Mi GPU: no room for both
                    objects.patch("classify", {"spec": {"model": {"weightsBytes": "200Mi"}}})
                    started = time.monotonic()

                    def rolled_out() -> dict[str, Any] | None:
                        status = (objects.get("classify") or {}).get("status") or {}
                        done = status.get("servingModelGeneration") == 2
                        return (
                            status
                            if done and any(a[1] == new_sum for a in traffic.answers)
                            else None
                        )

                    await until(rolled_out, "model generation 2 serving", 120)
                    took_seconds = time.monotonic() - started
                    await traffic.stop()
                warnings = [
                    e for e in events_of(objects, "classify") if e.reason == "RolloutInterrupts"
                ]
                assert [e.type for e in warnings] == ["Warning"], warnings
                assert "released first" in warnings[0].message, warnings[0].message
                # Meanwhile: answers of the old model, then waits answered 503 with
                # Retry-After (as during a swap-in) or held until the new one answered; never
                # a 404 or another refusal.
                codes = {a[0] for a in traffic.answers}
                assert codes <= {200, 503}, [a for a in traffic.answers if a[0] not in (200, 503)][
                    :3
                ]
                assert all(a[2].split(" ", 1)[0] for a in traffic.answers if a[0] == 503)
                assert took_seconds < 100
                node = nodes["node-a"]
                held = await node.control.model(uid)
                assert held["modelGeneration"] == 2, held
                assert not await triton_serves(node, triton_model_name(uid))
                await until(
                    lambda: objects.condition("classify", "RolledOut").get("status") == "True",
                    "RolledOut=True",
                )
        objects.close()


@pytest.mark.timeout(300)
async def test_a_source_edit_serves_the_new_model_under_the_same_name(tmp_path: Path) -> None:
    with emulator() as api:
        objects = Objects(api)
        async with agents(api, tmp_path, names=("node-a",)) as nodes:
            with operator(api):
                objects.apply(classify_sized("32Mi"))
                first = await wait_ready(objects, "classify")
                uid = first["metadata"]["uid"]
                address, port = slice_address(objects.endpoint_slice("classify"))
                host = "classify.default.svc"
                checksum_of(await checksum_through_service(address, port, host))

                # Another model behind the same name: the language model, which completes.
                objects.patch(
                    "classify",
                    {"spec": {"model": {"source": {"uri": "/models/tinylm"},
                                        "weightsBytes": "64Mi", "kvCacheBytes": "4Mi"}}},
                )  # fmt: skip

                def rolled_out() -> dict[str, Any] | None:
                    status = (objects.get("classify") or {}).get("status") or {}
                    return status if status.get("servingModelGeneration") == 2 else None

                status = await until(rolled_out, "the new source's model serving", 120)
                assert status["modelGeneration"] == 2, status
                await tinylm_completes(address, port, host, "classify")
                node = nodes["node-a"]
                assert await triton_serves(node, triton_model_name(instance_key(uid, 2)))

                async def old_released() -> bool:
                    return not await triton_serves(node, triton_model_name(uid))

                await until_async(old_released, "the old model out of Triton", 60)
        objects.close()
