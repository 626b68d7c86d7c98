"""Day-2 operations through the operator (issue 27): the API emulator, real agents (real
Triton, sim GPUs) and the operator, as a platform engineer drives them with kubectl.

- Deleting the leader Lease: the standby re-creates it at term 0, yet pushes above every
  term the agents have seen: no model goes unready, at most one push per agent refused.
- Deleting a source's credentials Secret: the resident model keeps answering; its Loaded
  condition and a Warning Event say the source is no longer reachable; a new model that
  needs the Secret fails with that reason.
- Events: every Ready transition posts or bumps an Event (count, lastTimestamp), also the
  second recovery, so the newest Event agrees with the condition.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_operator import EXAMPLES, classify_through_service, ready, wait_ready
from tests.integration.test_reliability_secrets import PLANTED, protected_model, source_secret
from tests.support.kube_testing import REPO_ROOT, Kubectl, load_yaml
from tests.support.operator_processes import OperatorProcess
from tests.support.operator_world import (
    GRACE_SECONDS,
    OPERATOR_NAMESPACE,
    Objects,
    agents,
    emulator,
    operator,
)
from tests.support.origin import Files, mlp_archive, served
from tests.support.service_calls import mlp_answers, slice_address
from tests.support.waiting import until, until_async

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]
LEADER_LEASE = "modelswap-operator"  # settings.DEFAULT_LEADER_LEASE, as the chart names it
OPERATIONS_DOC = REPO_ROOT / "docs" / "operations.md"


def doc_command(prefix: str) -> list[str]:
    """The words of the command docs/operations.md gives on a line starting with `prefix`
    (so the doc's Day-2 command is the one tested)."""
    for line in OPERATIONS_DOC.read_text().splitlines():
        if line.startswith(prefix):
            return shlex.split(line.split(" #", 1)[0])
    raise AssertionError(f"{OPERATIONS_DOC.name} has no command {prefix!r}")


def classify_on(name: str, node: str) -> dict[str, Any]:
    """The classify example under `name`, kept on `node` and never swapped out for idleness
    (a reload after a drop would blur what these tests watch)."""
    body = load_yaml(EXAMPLES / "classify-drop-on-idle.yaml")
    body["metadata"]["name"] = name
    body["spec"]["placement"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    body["spec"]["swapPolicy"] = {"idleAfter": "never", "priority": 10}
    return body


class Guarded(Files):
    """The archive only for the credential the Secret holds; 401 otherwise."""

    def do_GET(self) -> None:  # noqa: N802 - http.server names it
        if self.headers.get("Authorization") != f"Bearer {PLANTED}":
            self.send_error(401)
            return
        super().do_GET()


def refused_pushes(process: OperatorProcess) -> float:
    """The operator's `modelswap_operator_pushes_total{outcome="refused"}` from /metrics."""
    text = httpx.get(f"http://127.0.0.1:{process.port}/metrics", timeout=5, trust_env=False).text
    match = re.search(r'^modelswap_operator_pushes_total\{outcome="refused"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


async def leader_and_standby(
    pair: list[OperatorProcess],
) -> tuple[OperatorProcess, OperatorProcess]:
    """(leader, standby) as they stand now. A replica that exited (it lost the Lease: on a
    busy machine a 2 s Lease can run out while it starts) is started again, as its pod's
    restart would, and stands by."""
    for process in pair:
        if process.popen.poll() is not None:
            process.start()

    def roles() -> tuple[OperatorProcess, OperatorProcess] | None:
        codes = [p.readyz() for p in pair]
        if sorted(codes, key=str) != [200, 503]:
            return None
        return (pair[0], pair[1]) if codes[0] == 200 else (pair[1], pair[0])

    return await until(roles, "one operator leading, the other standing by")


@pytest.mark.timeout(300)
async def test_deleting_the_leader_lease_leaves_every_model_ready(tmp_path: Path) -> None:
    names = {"one-a": "node-a", "two-a": "node-a", "one-b": "node-b"}
    with emulator() as api:
        objects = Objects(api)
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        async with agents(api, tmp_path, names=("node-a", "node-b")) as nodes:
            pair = [OperatorProcess(api, tmp_path, f"op-{i}") for i in range(2)]
            try:
                for process in pair:
                    process.start()
                await until(lambda: any(p.readyz() == 200 for p in pair), "one operator leads")
                for name, node in names.items():
                    objects.apply(classify_on(name, node))
                for name in names:
                    await wait_ready(objects, name)
                leader, standby = await leader_and_standby(pair)

                # The leader runs a while: its revision counter climbs with the heartbeats.
                async def counter_above(count: int) -> bool:
                    for running in nodes.values():
                        revision = (await running.control.node())["revision"]
                        if revision["counter"] < count:
                            return False
                    return True

                await until_async(lambda: counter_above(8), "eight pushes to each agent", 30)
                seen = {n: (await r.control.node())["revision"] for n, r in nodes.items()}

                deletion = doc_command("kubectl -n modelswap-system delete lease")
                assert deletion[1:] == ["-n", OPERATOR_NAMESPACE, "delete", "lease", LEADER_LEASE]
                kubectl.run(*deletion[1:], check=True)
                # Watch every model's Ready from the deletion until the new leader has led
                # for several push rounds (its pushes are refused within its first turn).
                unready: list[tuple[str, dict[str, Any]]] = []
                led_at: float | None = None
                deadline = time.monotonic() + 30
                while led_at is None or time.monotonic() - led_at < 3 * GRACE_SECONDS:
                    assert time.monotonic() < deadline, "the standby never led"
                    for name in names:
                        condition = objects.condition(name, "Ready")
                        if condition.get("status") != "True":
                            unready.append((name, condition))
                    if led_at is None and standby.readyz() == 200:
                        led_at = time.monotonic()
                    await asyncio.sleep(0.1)
                assert unready == [], unready[:3]

                # The standby leads, above every term the agents had seen, and the agents
                # took its pushes: at most one refused per agent.
                for node, running in nodes.items():
                    revision = (await running.control.node())["revision"]
                    assert revision["term"] > seen[node]["term"], (node, revision, seen[node])
                assert refused_pushes(standby) <= len(nodes), standby.log()[-3000:]
                holder = kubectl.run("-n", OPERATOR_NAMESPACE, "get", "lease", LEADER_LEASE,
                                     "-o", "jsonpath={.spec.holderIdentity}", check=True)  # fmt: skip
                assert holder.stdout.startswith(standby.name), holder.stdout
                # The old leader found its Lease gone and stopped (its pod would restart it).
                assert leader.popen.poll() == 1 and "leadership lost" in leader.log()
                for name in names:
                    await classify_through_service(objects, name)
            finally:
                codes = [p.stop() for p in pair]
        assert codes[pair.index(standby)] == 0, standby.log()[-3000:]
        objects.close()


@pytest.mark.timeout(300)
async def test_a_deleted_source_secret_leaves_the_resident_model_serving(tmp_path: Path) -> None:
    Files.files = {"/mlp.tar.gz": mlp_archive()}
    Files.authorizations = []
    with served(Guarded) as origin, emulator() as api:
        objects = Objects(api)
        api.create(source_secret("hub", f"Bearer {PLANTED}"))
        async with agents(api, tmp_path, names=("node-a",)):
            with operator(api):
                objects.apply(protected_model("guarded", origin, "hub"))
                await wait_ready(objects, "guarded")
                address, port = slice_address(objects.endpoint_slice("guarded"))
                await mlp_answers(address, port, "guarded.default.svc", "mlp")

                objects.core.delete_namespaced_secret("hub", "default")
                loaded = await until(
                    lambda: (
                        objects.condition("guarded", "Loaded").get("reason")
                        == "CredentialsUnavailable"
                        and objects.condition("guarded", "Loaded")
                    ),
                    "Loaded to say the credentials are gone",
                )
                assert loaded["status"] == "True", loaded
                assert "no longer reachable" in loaded["message"], loaded
                assert "Secret 'hub' does not exist" in loaded["message"], loaded
                # Past the agent's grace period (after which a model left out of the set is
                # unloaded), it still answers, and says it is Ready.
                answered_until = time.monotonic() + 2 * GRACE_SECONDS + 1
                while time.monotonic() < answered_until:
                    await mlp_answers(address, port, "guarded.default.svc", "mlp")
                    assert ready(objects, "guarded") is not None, objects.get("guarded")
                warnings = [
                    e
                    for e in objects.core.list_namespaced_event(
                        "default", field_selector="involvedObject.name=guarded"
                    ).items
                    if e.reason == "CredentialsUnavailable"
                ]
                assert [e.type for e in warnings] == ["Warning"], warnings
                assert "no longer reachable" in warnings[0].message

                # A model that needs the Secret to load fails with that reason.
                objects.apply(protected_model("later", origin, "hub"))
                later = await until(
                    lambda: (
                        objects.condition("later", "Loaded").get("reason")
                        == "CredentialsUnavailable"
                        and objects.condition("later", "Loaded")
                    ),
                    "the new model to fail for the missing Secret",
                )
                assert later["status"] == "False" and "'hub'" in later["message"], later

                # The Secret back: both load, the condition says so.
                api.create(source_secret("hub", f"Bearer {PLANTED}"))
                await wait_ready(objects, "later")
                await until(
                    lambda: objects.condition("guarded", "Loaded").get("reason") == "Resident",
                    "guarded's Loaded back to Resident",
                )
                await mlp_answers(address, port, "guarded.default.svc", "mlp")
        objects.close()


def ready_events(objects: Objects, name: str) -> list[Any]:
    """The Events of `name` that report its Ready condition."""
    found = objects.core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name}"
    ).items
    return [e for e in found if e.message.startswith("Ready=")]


def counts(events: list[Any]) -> Counter[str]:
    """Occurrences per reason: each Event's count, summed over Events of one reason."""
    total: Counter[str] = Counter()
    for event in events:
        total[event.reason] += event.count or 1
    return total


@pytest.mark.timeout(240)
async def test_every_ready_transition_posts_or_bumps_an_event(tmp_path: Path) -> None:
    from modelswap_sidecar.control.certificate import self_signed

    with emulator() as api:
        objects = Objects(api)
        # No status rewrites by the agent: the test swaps the SwapNode's certificate.
        async with agents(api, tmp_path, names=("node-a",), status_interval_seconds=600):
            with operator(api):
                objects.apply(classify_on("classify", "node-a"))
                await wait_ready(objects, "classify")
                swapnode = objects.custom.get_cluster_custom_object(
                    "modelswap.io", "v1alpha1", "swapnodes", "node-a"
                )
                own = swapnode["status"]["certificate"]
                foreign = self_signed(["127.0.0.1", "node-a"]).certificate_pem
                for round_number in (1, 2):
                    # The operator stops trusting the agent: Ready=False...
                    objects.custom.patch_cluster_custom_object_status(
                        "modelswap.io", "v1alpha1", "swapnodes", "node-a",
                        {"status": {"certificate": foreign}},
                    )  # fmt: skip
                    await until(
                        lambda: objects.condition("classify", "Ready").get("status") == "False",
                        f"classify unready (round {round_number})",
                    )
                    # ...and trusts it again: Ready=True, an Event for each transition.
                    objects.custom.patch_cluster_custom_object_status(
                        "modelswap.io", "v1alpha1", "swapnodes", "node-a",
                        {"status": {"certificate": own}},
                    )  # fmt: skip
                    await wait_ready(objects, "classify")
                    await until(
                        lambda n=round_number: (
                            counts(ready_events(objects, "classify"))["Serving"] == n + 1
                        ),
                        f"Ready=True counted {round_number + 1} times",
                    )
                    events = ready_events(objects, "classify")
                    assert counts(events)["AgentUnavailable"] == round_number, events
                    # One series per transition: the recovery bumped the first Event.
                    (serving,) = [e for e in events if e.reason == "Serving"]
                    assert serving.count == round_number + 1
                    assert serving.last_timestamp >= max(e.last_timestamp for e in events)
                await classify_through_service(objects, "classify")
        objects.close()
