"""The operator end to end: the API emulator, three real agents (real Triton, sim GPUs) and
the operator under KopfRunner. What a user does — `kubectl apply`, edit, delete, a node
that dies — and what they see: status, Events, and answers through the model's Service."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client

from tests.support.kube_testing import REPO_ROOT, Kubectl, load_yaml
from tests.support.operator_processes import OperatorProcess
from tests.support.operator_world import OPERATOR_NAMESPACE, Objects, agents, emulator, operator
from tests.support.service_calls import mlp_answers, slice_address, tinylm_completes
from tests.support.waiting import until

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]
T = TypeVar("T")
EXAMPLES = REPO_ROOT / "examples" / "toy"  # the numpy models: quick to load


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
    """The classify model answers through the address its EndpointSlice gives, with the
    Service's Host header, as the reference computes."""
    address, port = slice_address(objects.endpoint_slice(name, namespace))
    await mlp_answers(address, port, f"{name}.{namespace}.svc", "classify")


async def complete_through_service(objects: Objects, name: str, model: str) -> None:
    """A tinylm model completes through its Service as the reference says."""
    address, port = slice_address(objects.endpoint_slice(name))
    await tinylm_completes(address, port, f"{name}.default.svc", model)


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
                                          "Loaded": "True", "Ready": "True",
                                          "RolledOut": "True"}  # fmt: skip
                    assert status["modelGeneration"] == status["servingModelGeneration"] == 1
                await classify_through_service(objects, "classify")
                await complete_through_service(objects, "summarize", "summarize")
                await complete_through_service(objects, "chat-pinned", "chat")

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
                stuck = load_yaml(EXAMPLES / "classify-drop-on-idle.yaml")
                stuck["metadata"]["name"] = "stuck"
                stuck["spec"]["placement"]["nodeSelector"] = {"kubernetes.io/hostname": lost}
                objects.apply(stuck)  # can live only on that node
                await wait_ready(objects, "stuck")
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

                # A model that cannot leave the lost node says why; deleting it completes.
                await until(
                    lambda: objects.condition("stuck", "Placed").get("reason") == "NoMatchingNode",
                    "stuck unplaced, naming its nodeSelector",
                )
                assert (
                    "spec.placement.nodeSelector" in objects.condition("stuck", "Placed")["message"]
                )
                kubectl.run("delete", "md", "stuck", "--wait=false", check=True)
                await until(lambda: objects.get("stuck") is None, "stuck gone with its node lost")
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


def stub_pids(nodes: dict[str, Any], obj: dict[str, Any]) -> list[int]:
    """The model's python-backend processes on its node (a reload would change them)."""
    pids: list[int] = nodes[obj["status"]["node"]].triton.stub_pids(obj["metadata"]["uid"])
    return pids


@pytest.mark.timeout(300)
async def test_restart_recreate_and_two_namespaces(tmp_path: Path) -> None:
    with emulator(namespaces=("default", "team-b")) as api:
        objects = Objects(api)
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        async with agents(api, tmp_path, names=("node-a",)) as nodes:
            classify = load_yaml(EXAMPLES / "classify-drop-on-idle.yaml")
            with operator(api) as first:
                objects.apply(classify)
                other = {**classify, "metadata": {"name": "classify", "namespace": "team-b"}}
                objects.apply(other)
                before = {
                    ns: await wait_ready(objects, "classify", ns) for ns in ("default", "team-b")
                }
                pids = {ns: stub_pids(nodes, obj) for ns, obj in before.items()}
                assert all(pids.values()) and pids["default"] != pids["team-b"]
                first_term = first.runtime.elector.term
            # Two namespaces, one name, one node: each answers through its own Service.
            for namespace in ("default", "team-b"):
                await classify_through_service(objects, "classify", namespace)

            # A new operator process: same places, no reload, a higher term.
            with operator(api) as second:
                await until(second.runtime.ready, "the new operator leads")
                registry = second.runtime.metrics.registry
                await until(  # a few turns of the new loop, each one a chance to reload
                    lambda: (
                        (registry.get_sample_value("modelswap_operator_reconcile_turns_total") or 0)
                        >= 3
                    ),
                    "three turns of the new operator's loop",
                )
                for namespace, obj in before.items():
                    now = await wait_ready(objects, "classify", namespace)
                    assert (now["status"]["node"], now["status"]["gpu"]) == (
                        obj["status"]["node"], obj["status"]["gpu"])  # fmt: skip
                    assert stub_pids(nodes, now) == pids[namespace]
                assert (second.runtime.elector.term or 0) > (first_term or 0)

                # Delete and recreate under the same name: the new UID loads, the old goes.
                old_uid = before["default"]["metadata"]["uid"]
                kubectl.run("delete", "md", "classify", "-n", "default", check=True)
                objects.apply(classify)
                recreated = await wait_ready(objects, "classify")
                assert recreated["metadata"]["uid"] != old_uid
                held = await nodes["node-a"].control.models()
                assert recreated["metadata"]["uid"] in held and old_uid not in held
                await classify_through_service(objects, "classify")

                # kubectl describe: conditions and Events a user can act on.
                described = kubectl.run("describe", "md", "classify", "-n", "team-b", check=True)
                for text in ("Conditions", "Ready", "Placed", "Events"):
                    assert text in described.stdout, described.stdout
        objects.close()


@pytest.mark.timeout(180)
async def test_an_agent_whose_certificate_is_not_its_swapnodes_is_refused(tmp_path: Path) -> None:
    from modelswap_sidecar.control.certificate import self_signed

    with emulator() as api:
        objects = Objects(api)
        async with agents(api, tmp_path, names=("node-a",), status_interval_seconds=600):
            with operator(api):
                objects.apply(load_yaml(EXAMPLES / "classify-drop-on-idle.yaml"))
                await wait_ready(objects, "classify")
                # Someone else's certificate in the SwapNode: the operator must not talk to
                # the agent at that endpoint any more.
                foreign = self_signed(["127.0.0.1", "node-a"]).certificate_pem
                objects.custom.patch_cluster_custom_object_status(
                    "modelswap.io", "v1alpha1", "swapnodes", "node-a",
                    {"status": {"certificate": foreign}},
                )  # fmt: skip
                loaded = await until(
                    lambda: (
                        objects.condition("classify", "Loaded").get("reason") == "AgentUnavailable"
                        and objects.condition("classify", "Loaded")
                    ),
                    "the push refused for the certificate",
                )
                assert "certificate" in loaded["message"], loaded
        objects.close()


@pytest.mark.timeout(240)
async def test_two_operators_one_leader_and_a_late_push_is_refused(tmp_path: Path) -> None:
    with emulator() as api:
        objects = Objects(api)
        async with agents(api, tmp_path, names=("node-a",)) as nodes:
            pair = [OperatorProcess(api, tmp_path, f"op-{i}") for i in range(2)]
            try:
                for process in pair:
                    process.start()
                await until(lambda: any(p.readyz() == 200 for p in pair), "one operator leads")
                leader = next(p for p in pair if p.readyz() == 200)
                standby = next(p for p in pair if p is not leader)
                # The standby may start its health server after the leader leads.
                await until(lambda: standby.readyz() is not None, "the standby to answer", 30)
                assert standby.readyz() == 503  # alive, not leading
                objects.apply(load_yaml(EXAMPLES / "classify-drop-on-idle.yaml"))
                await wait_ready(objects, "classify")
                old_term = (await nodes["node-a"].control.node())["revision"]["term"]
                assert "pushed" not in standby.log(), standby.log()

                # The leader dies without a word: the standby takes the Lease within its
                # duration and a renewal round (then starts leading: kopf's start can take
                # seconds on a loaded machine, so readiness is waited for, not timed).
                leader.kill9()
                killed_at = time.monotonic()
                await until(lambda: _lease_holder(objects).startswith(standby.name),
                            "the standby to take the Lease", 20)  # fmt: skip
                took_over_seconds = time.monotonic() - killed_at
                assert took_over_seconds < 2 + 3, took_over_seconds  # lease + a renewal round
                await until(lambda: standby.readyz() == 200, "the standby to lead", 30)
                new_term = await _term_above(nodes["node-a"], old_term)

                # A push the dead leader had in flight, arriving late, is refused.
                control = nodes["node-a"].control
                control.counter += 1_000_000
                late = await control.put([], term=old_term)
                assert late.status_code == 409 and late.json()["reason"] == "OlderTerm", late.text
                assert new_term > old_term
                await wait_ready(objects, "classify")  # nothing unloaded by the late push
                held = await control.models()
                assert len(held) == 1
            finally:
                codes = [p.stop() for p in pair]
        assert codes[pair.index(standby)] == 0, standby.log()[-3000:]
        objects.close()


def _lease_holder(objects: Objects) -> str:
    lease = client.CoordinationV1Api(objects.core.api_client).read_namespaced_lease(
        "modelswap-operator", OPERATOR_NAMESPACE
    )
    return str(lease.spec.holder_identity or "")


async def _term_above(node: Any, term: int) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        revision = (await node.control.node()).get("revision") or {}
        if revision.get("term", -1) > term:
            return int(revision["term"])
        await asyncio.sleep(0.1)
    raise AssertionError(f"the agent never saw a term above {term}")
