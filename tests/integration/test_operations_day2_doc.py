"""docs/operations.md's day-2 procedures that no other test runs, run as the doc gives them
(its commands taken from its code blocks) against the authorizing API emulator with the
real helm and kubectl, real agents (real Triton, sim GPUs) and the real operator (issue 27):

- **Upgrading**: the doc's `helm upgrade` of a release serving a model, with a changed
  value; the operator rolled as its Deployment's strategy says (the new pod from the new
  manifests stands by, the old one stops, the new one leads); the node pod left as it is
  (`OnDelete`). No model goes unready, every request is answered, nothing is reloaded, and
  the new operator applies the changed value.
- **Upgrade order**: an agent newer than the operator (its SwapNode status carries a field
  the operator does not know, its CRD already upgraded) is left out by that operator, and
  its models become unplaced: why the doc upgrades the operator before the node pods.
- **Rotating a source's credentials**: the doc's `kubectl create secret ... | kubectl
  apply -f -`; the resident model is not reloaded and keeps answering, and the next load
  from the source uses the new value.
- **Draining a node** with a model that tolerates the unschedulable taint: it stays, and
  Ready, through the cordon, while the one that does not moves (the doc's
  `wait until ...` step).
- **Source credentials, changed with `helm upgrade`**: from `access: cluster` to `optIn`
  without a loaded model's namespace (it keeps serving), then opting it in (its Secret is
  read again, a new model there loads).
- **Uninstalling without the hook**: the doc's `modelswap uninstall` (with the kubeconfig
  it must be given), `helm uninstall --no-hooks` and `kubectl delete md --all -A`.

Elsewhere: the Lease and Secret deletion in test_operator_day2.py, uninstalling with the
hook in test_chart_uninstall.py, a drain of a model that moves in test_operations_doc.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import yaml
from kubernetes import client

from modelswap_sidecar.triton.process import free_loopback_port
from tests.integration.test_chart_credentials_optin import NODE as OPT_IN_NODE
from tests.integration.test_chart_credentials_optin import (
    NOT_OPTED_IN,
    OPTED_IN,
    model_in,
    seed,
    told,
)
from tests.integration.test_chart_credentials_optin import condition as opt_in_condition
from tests.integration.test_chart_credentials_optin import values as opt_in_values
from tests.integration.test_chart_install import (
    SOURCE_AUTHORIZATION,
    Cluster,
    _Sources,
    classify_through_service,
)
from tests.integration.test_chart_install import wait_ready as chart_ready
from tests.integration.test_chart_uninstall import _replicas
from tests.integration.test_operations_doc import (
    UNSCHEDULABLE_TAINT,
    Command,
    block_with,
    helm_args,
    node_taints,
    option,
    swapnode_taints,
    two_agents,
)
from tests.integration.test_operator import wait_ready
from tests.integration.test_operator_day2 import classify_on
from tests.support.chart_node import node_pod, stub_pids
from tests.support.chart_world import (
    CHART,
    HELM,
    MODELSWAP,
    NAMESPACE,
    NODE,
    OPERATOR,
    POOL,
    RELEASE,
    OperatorPod,
    Ports,
    Process,
    Release,
    chart_values,
    child_env,
    helm_env,
    install,
    operator,
)
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import REPO_ROOT, Kubectl, api_client, load_yaml
from tests.support.operator_world import Objects, agents, emulator
from tests.support.operator_world import operator as operator_thread
from tests.support.origin import Files, mlp_archive, served
from tests.support.service_calls import mlp_answers, slice_address
from tests.support.waiting import until, until_async

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

EXAMPLE = REPO_ROOT / "examples" / "toy" / "classify-drop-on-idle.yaml"
GROUP, VERSION = "modelswap.io", "v1alpha1"


def kept_resident(body: dict[str, Any]) -> dict[str, Any]:
    """The example as applied, never swapped out for idleness: a drop and a reload would
    blur what the upgrade must not do (reload the model)."""
    body["spec"]["swapPolicy"] = {"idleAfter": "never", "priority": 10}
    return body


def run_pipeline(kubectl: Kubectl, command: Command) -> subprocess.CompletedProcess[str]:
    """The doc's pipeline, each `kubectl` stage with the test's kubeconfig, the output of
    one stage the input of the next."""
    done = None
    for stage in command.pipeline:
        assert stage[0] == "kubectl", command.pipeline
        done = kubectl.run(*stage[1:], input_text=done.stdout if done else None)
        assert done.returncode == 0, f"{' '.join(stage)}: {done.stderr}"
    assert done is not None
    return done


class Watch:
    """Samples `probe` (None: fine; else what was wrong) every `interval_seconds` until
    stopped; the failures it saw, with when."""

    def __init__(self, probe: Callable[[], Awaitable[str | None]], interval_seconds: float):
        self.probe = probe
        self.interval_seconds = interval_seconds
        self.failures: list[tuple[float, str]] = []
        self.samples = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            wrong = await self.probe()
            self.samples += 1
            if wrong is not None:
                self.failures.append((round(time.monotonic() - started, 1), wrong))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval_seconds)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


# -- upgrading ------------------------------------------------------------------------------


def upgrade_command() -> Command:
    """The doc's `helm upgrade` in "Upgrading"."""
    (command,) = [c for c in block_with("helm", "upgrade") if c.argv[:2] == ("helm", "upgrade")]
    return command


def health(port: int, path: str) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2, trust_env=False).status_code
    except httpx.HTTPError:
        return None


def http_port_of(pod: OperatorPod) -> int:
    (arg,) = [a for a in pod.container["args"] if a.startswith("--http-port=")]
    return int(arg.split("=", 1)[1])


def set_http_port(pod: OperatorPod, port: int) -> None:
    """Each pod has its own IP in a cluster; here both replicas share loopback, so the
    surge pod gets another free port (nothing else of its rendered args changes)."""
    pod.container["args"] = [f"--http-port={port}" if a.startswith("--http-port=") else a
                             for a in pod.container["args"]]  # fmt: skip


@pytest.mark.timeout(600)
async def test_helm_upgrade_as_the_doc_gives_it_keeps_every_model_ready(tmp_path: Path) -> None:
    command = upgrade_command()
    ports = Ports.pick()
    values = chart_values(ports)
    with EmulatorThread(tls=True) as api:
        release = install(api, values, tmp_path)
        cluster = Cluster(api)
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": NODE, "labels": {"modelswap.io/pool": POOL,
                                     "kubernetes.io/hostname": NODE}}})  # fmt: skip
        surge: OperatorPod | None = None
        try:
            with operator(api, release, tmp_path / "operator") as old_pod:
                await until(lambda: cluster.secret("modelswap-control-token"),
                            "the operator to create the control token Secret")  # fmt: skip
                async with node_pod(api, release, NODE) as node:
                    body = kept_resident(load_yaml(EXAMPLE))
                    cluster.custom.create_namespaced_custom_object(
                        GROUP, VERSION, "default", "modeldeployments", body
                    )
                    before = await chart_ready(cluster, "classify")
                    await classify_through_service(cluster, "classify")
                    # The value the upgrade changes: a policy default the model leaves unset.
                    old_default = values["policyDefaults"]["swapPolicy"]["minResident"]
                    assert before["status"]["effectivePolicy"]["minResident"] == old_default
                    runtime_pid = node.child("runtime")["pid"]
                    agent_pid = node.child("agent")["pid"]
                    stubs = sorted(stub_pids(runtime_pid))
                    assert stubs, "no model process under Triton"

                    async def serving() -> str | None:
                        """Ready, and answering through its Service, now."""
                        found = await asyncio.to_thread(cluster.ready, "classify")
                        if found is None:
                            return f"unready: {await asyncio.to_thread(cluster.model, 'classify')}"
                        try:
                            await classify_through_service(cluster, "classify")
                        except (AssertionError, httpx.HTTPError) as e:
                            return f"unanswered: {e!r}"
                        return None

                    watch = Watch(serving, 0.3)
                    watch.start()
                    try:
                        changed = json.loads(json.dumps(values))
                        changed["policyDefaults"]["swapPolicy"]["minResident"] = "2m"
                        surge, upgraded = await upgrade(
                            api,
                            release,
                            command=command,
                            changed=changed,
                            tmp_path=tmp_path,
                            old_pod=old_pod,
                        )
                        # The new operator leads and applies the new value; a few push rounds
                        # more under it.
                        await until(lambda: ((cluster.model("classify") or {}).get("status")
                                             or {}).get("effectivePolicy", {}).get("minResident")
                                    == "2m", "the new operator's defaults applied", 60)  # fmt: skip
                        # Watched for three more push rounds (one every graceSeconds / 3).
                        await asyncio.sleep(values["graceSeconds"])
                    finally:
                        await watch.stop()
                    assert watch.samples > 10, watch.samples
                    assert watch.failures == [], watch.failures[:3]

                    # Nothing lost: the node pod is the one from before (OnDelete), and the
                    # model was never reloaded: the same agent, Triton and model process.
                    assert (node.child("agent")["pid"], node.child("runtime")["pid"]) == (
                        agent_pid, runtime_pid)  # fmt: skip
                    assert sorted(stub_pids(runtime_pid)) == stubs
                    after = cluster.model("classify") or {}
                    assert after["metadata"]["uid"] == before["metadata"]["uid"]
                    assert after["status"]["node"] == NODE
                    assert after["status"]["phase"] == "Resident", after["status"]

                # Then the node pod, replaced by one from the new manifests (the drain's
                # `delete pod`; one node here, so the model has nowhere to move): a new Triton
                # and an empty host store, the model reloaded from its source and answering.
                async with node_pod(api, upgraded, NODE) as replaced:
                    runtime = replaced.child("runtime")["pid"]
                    assert runtime != runtime_pid
                    await until(
                        lambda: stub_pids(runtime), "classify reloaded under the new Triton", 90
                    )
                    await chart_ready(cluster, "classify")
                    await until_async(lambda: answers(cluster, "classify"),
                                      "classify answering from the new node pod", 60)  # fmt: skip
                    assert (cluster.model("classify") or {})["status"]["node"] == NODE
        finally:
            if surge is not None:
                surge.stop()
        cluster.client.close()


async def upgrade(
    api: EmulatorThread,
    release: Release,
    *,
    command: Command,
    changed: dict[str, Any],
    tmp_path: Path,
    old_pod: OperatorPod,
) -> tuple[OperatorPod, Release]:
    """The doc's `helm upgrade` with the `changed` values, then what the Deployment
    controller and the kubelet do with the rendered strategy: a surge pod from the new
    manifests, the old pod stopped once the new one is ready (its /healthz, the readiness
    probe). Answers the new pod, leading, and the upgraded release."""
    folder = tmp_path / f"upgrade-{old_pod.starts}"
    folder.mkdir()
    values_file = folder / "values.yaml"
    values_file.write_text(yaml.safe_dump(changed))
    args, namespace = helm_args(command, values_file)
    assert namespace == NAMESPACE, command.argv
    # The doc's release name and chart path are this test's.
    positional = [a for a in args if not a.startswith("-")]
    assert positional[:2] == ["modelswap", "charts/modelswap"], args
    args[args.index(positional[0])] = RELEASE
    args[args.index(positional[1])] = str(CHART)
    done = await asyncio.to_thread(
        subprocess.run, [str(HELM), "upgrade", *args], env=helm_env(api), capture_output=True,
        text=True, timeout=120, check=False, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "STATUS: deployed" in done.stdout, done.stdout

    manifest = await asyncio.to_thread(
        subprocess.run, [str(HELM), "get", "manifest", RELEASE, "-n", NAMESPACE],
        env=helm_env(api), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    new = Release([d for d in yaml.safe_load_all(manifest.stdout) if d])
    deployment = new.find("Deployment", OPERATOR)
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}  # fmt: skip
    # A changed value in the operator's ConfigMap (its checksum is in the pod template) or
    # its args makes the Deployment roll.
    old_template = release.find("Deployment", OPERATOR)["spec"]["template"]
    assert deployment["spec"]["template"] != old_template, "the operator's pods would not roll"
    # The node pods do not change by themselves.
    (daemonset,) = new.all("DaemonSet")
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}, daemonset["spec"]

    surge = OperatorPod(api, new, folder / "operator")
    surge.starts = old_pod.starts  # the next start is a new pod name, as a new ReplicaSet's
    port = free_loopback_port()
    set_http_port(surge, port)
    surge.start()
    await until(lambda: health(port, "/healthz") == 200, "the new pod ready (/healthz)", 60)
    assert health(port, "/readyz") == 503, "the new pod leads though the old one holds the Lease"
    old_port = http_port_of(old_pod)
    assert health(old_port, "/readyz") == 200
    old_pod.stop()  # SIGTERM: exit 0, the Lease released
    await until(lambda: health(port, "/readyz") == 200, "the new pod to lead", 60)
    return surge, new


async def answers(cluster: Cluster, name: str) -> bool:
    try:
        await classify_through_service(cluster, name)
    except (AssertionError, httpx.HTTPError):
        return False
    return True


# -- the upgrade order ----------------------------------------------------------------------

NEWER_FIELD = "newerField"


def add_status_field(api: EmulatorThread, name: str) -> None:
    """The SwapNode CRD with one more status property, as a newer chart's CRD would have
    (`helm upgrade` applies the CRDs with the operator)."""
    with api_client(api.kubeconfig_path) as admin:
        extensions = client.ApiextensionsV1Api(admin)
        crd = extensions.read_custom_resource_definition(f"swapnodes.{GROUP}")
        body = admin.sanitize_for_serialization(crd)
        for version in body["spec"]["versions"]:
            status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
            status["properties"][name] = {"type": "string"}
        extensions.replace_custom_resource_definition(f"swapnodes.{GROUP}", body)


@pytest.mark.timeout(300)
async def test_a_field_the_other_version_does_not_know_is_refused_both_ways(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator reads SwapNode status strictly: a field it does not know (a newer
    agent's, written after a newer CRD) makes it leave that node out, so its models lose
    their place. Hence the doc's order: the operator first, the node pods after. The other
    way is strict too: an agent refuses a desired set with a field it does not know (a
    newer operator's), so that order holds only while the new operator sends nothing new."""
    with emulator() as api:
        objects = Objects(api)
        # No periodic status rewrites: the newer agent's field stays until the test removes it.
        async with agents(api, tmp_path, names=("node-a",), status_interval_seconds=600) as nodes:
            with operator_thread(api), caplog.at_level(logging.WARNING):
                objects.apply(classify_on("pinned-here", "node-a"))
                await wait_ready(objects, "pinned-here")

                # A newer operator's set: refused whole, naming the field (under term 0, so
                # that, were it taken, it could not replace the operator's set either).
                newer_set = {"revision": {"term": 0, "counter": 0}, "entries": [],
                             NEWER_FIELD: "x"}  # fmt: skip
                refused = await nodes["node-a"].control.client.put("/v1/desired", json=newer_set)
                assert refused.status_code == 400, refused.text
                assert NEWER_FIELD in refused.text and "unknown field" in refused.text, refused.text
                assert objects.condition("pinned-here", "Ready")["status"] == "True"

                add_status_field(api, NEWER_FIELD)
                objects.custom.patch_cluster_custom_object_status(
                    GROUP, VERSION, "swapnodes", "node-a", {"status": {NEWER_FIELD: "x"}}
                )
                stored = objects.custom.get_cluster_custom_object(
                    GROUP, VERSION, "swapnodes", "node-a"
                )
                assert stored["status"][NEWER_FIELD] == "x", "the emulator pruned the field"
                placed = await until(
                    lambda: (objects.condition("pinned-here", "Placed").get("status") == "False"
                             and objects.condition("pinned-here", "Placed")),
                    "the model to lose its place on the node the operator cannot read",
                )  # fmt: skip
                assert objects.condition("pinned-here", "Ready")["status"] == "False"
                left_out = [r.getMessage() for r in caplog.records
                            if "SwapNode node-a cannot be read, leaving it out" in r.getMessage()]  # fmt: skip
                assert left_out and "unknown field" in left_out[0], (left_out, placed)

                # The same status without the field (what an operator that knows it reads):
                # the node is used again.
                objects.custom.patch_cluster_custom_object_status(
                    GROUP, VERSION, "swapnodes", "node-a", {"status": {NEWER_FIELD: None}}
                )
                await wait_ready(objects, "pinned-here")
        objects.close()


# -- rotating a source's credentials --------------------------------------------------------

OLD, NEW = "Bearer OLD-TOKEN", "Bearer NEW-TOKEN"


class Rotating(Files):
    """The archives, to the credentials in `accepted` only (401 otherwise); every request
    recorded as (path, Authorization)."""

    accepted: ClassVar[set[str]] = set()
    requests: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server names it
        authorization = self.headers.get("Authorization")
        self.requests.append((self.path, authorization))
        if authorization not in self.accepted:
            self.send_error(401)
            return
        super().do_GET()


def rotation_command() -> tuple[Command, str, str]:
    """The doc's rotation pipeline, its namespace and its Secret's name."""
    (command,) = block_with("kubectl", "-n", "team-a", "create", "secret")
    argv = command.argv
    namespace = argv[argv.index("-n") + 1]
    secret = argv[argv.index("generic") + 1]
    assert command.pipeline[1:] == (("kubectl", "apply", "-f", "-"),), command.pipeline
    assert f"--from-literal=authorization={NEW}" in argv, argv
    return command, namespace, secret


def guarded_model(name: str, namespace: str, url: str, path: str, secret: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": "mlp", "weightsBytes": "32Mi",
                               "source": {"uri": f"{url}{path}",
                                          "credentialsSecretRef": {"name": secret}}},
                     "swapPolicy": {"idleAfter": "never"}}}  # fmt: skip


@pytest.mark.timeout(300)
async def test_rotating_a_source_secret_as_the_doc_says(tmp_path: Path) -> None:
    command, namespace, secret = rotation_command()
    Rotating.files = {"/mlp.tar.gz": mlp_archive(), "/mlp-b.tar.gz": mlp_archive()}
    Rotating.accepted = {OLD}
    Rotating.requests = []
    with served(Rotating) as origin, emulator(namespaces=("default", namespace)) as api:
        objects = Objects(api)
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        # The same pipeline creates the Secret when there is none (here: the old token).
        run_pipeline(kubectl, command.substituted({NEW: OLD}))
        async with agents(api, tmp_path, names=("node-a",)) as nodes:
            with operator_thread(api):
                objects.apply(guarded_model("guarded", namespace, origin, "/mlp.tar.gz", secret))
                loaded = await wait_ready(objects, "guarded", namespace)
                address, port = slice_address(objects.endpoint_slice("guarded", namespace))
                host = f"guarded.{namespace}.svc"
                await mlp_answers(address, port, host, "mlp")
                assert Rotating.requests == [("/mlp.tar.gz", OLD)], Rotating.requests
                uid = loaded["metadata"]["uid"]
                stubs = nodes["node-a"].triton.stub_pids(uid)
                assert stubs

                # The rotation: the origin issues the new token and revokes the old.
                Rotating.accepted = {NEW}
                run_pipeline(kubectl, command)
                stored = objects.core.read_namespaced_secret(secret, namespace)
                assert base64.b64decode(stored.data["authorization"]).decode() == NEW

                # The resident model is not reloaded and keeps answering, Ready, past a few
                # of the operator's turns (it reads the Secret at each).
                answered_until = time.monotonic() + 5
                while time.monotonic() < answered_until:
                    await mlp_answers(address, port, host, "mlp")
                    assert objects.condition("guarded", "Ready", namespace)["status"] == "True"
                    await asyncio.sleep(0.2)
                assert nodes["node-a"].triton.stub_pids(uid) == stubs
                assert Rotating.requests == [("/mlp.tar.gz", OLD)], Rotating.requests
                assert objects.condition("guarded", "Loaded", namespace)["reason"] == "Resident"

                # The next load from the source uses the new value.
                objects.apply(guarded_model("later", namespace, origin, "/mlp-b.tar.gz", secret))
                await wait_ready(objects, "later", namespace)
                assert Rotating.requests[1:] == [("/mlp-b.tar.gz", NEW)], Rotating.requests
                await mlp_answers(address, port, host, "mlp")
        objects.close()


# -- draining a node with a model that tolerates the taint ----------------------------------


def tolerating(name: str, node_name: str) -> dict[str, Any]:
    """The example, kept on `node_name`, tolerating the taint a cordon adds."""
    body = classify_on(name, node_name)
    body["spec"]["placement"]["tolerations"] = [
        {"key": UNSCHEDULABLE_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
    ]
    return body


def moving(name: str) -> dict[str, Any]:
    body = kept_resident(load_yaml(EXAMPLE))
    body["metadata"]["name"] = name
    return body


@pytest.mark.timeout(300)
async def test_drain_keeps_a_model_that_tolerates_the_taint(tmp_path: Path) -> None:
    drain = block_with("kubectl", "cordon")
    placeholder = next(c for c in drain if c.argv[:2] == ("kubectl", "cordon")).argv[2]
    wait_step = next(c for c in drain if c.argv[1:3] == ("get", "md"))
    assert "tolerate" in wait_step.comment, wait_step.comment
    with emulator() as api:
        objects = Objects(api)
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        try:
            async with two_agents(api, tmp_path):
                with operator_thread(api):
                    objects.apply(moving("moves"))
                    first = (await wait_ready(objects, "moves"))["status"]["node"]
                    objects.apply(tolerating("stays", first))
                    await wait_ready(objects, "stays")

                    async def stays_serving() -> str | None:
                        condition = await asyncio.to_thread(objects.condition, "stays", "Ready")
                        if condition.get("status") != "True":
                            return f"stays unready: {condition}"
                        return None

                    watch = Watch(stays_serving, 0.2)
                    watch.start()
                    try:
                        for step in (c.substituted({placeholder: first}) for c in drain):
                            await drain_step(kubectl, objects, step, first)
                    finally:
                        await watch.stop()
                    assert watch.failures == [], watch.failures[:3]
                    stays = objects.get("stays") or {}
                    assert stays["status"]["node"] == first
                    moved = objects.get("moves") or {}
                    assert moved["status"]["node"] != first
                    address, port = slice_address(objects.endpoint_slice("stays"))
                    await mlp_answers(address, port, "stays.default.svc", "classify")
        finally:
            objects.close()


async def drain_step(kubectl: Kubectl, objects: Objects, step: Command, node_name: str) -> None:
    argv = step.argv
    if argv[1] == "cordon":
        kubectl.run(*argv[1:], check=True)
        # The emulator sets spec.unschedulable; a cluster's node controller then adds the
        # taint. Do what it does.
        taints = [*node_taints(kubectl, node_name), UNSCHEDULABLE_TAINT]
        kubectl.run("patch", "node", node_name, "-p", json.dumps({"spec": {"taints": taints}}),
                    check=True)  # fmt: skip
        await until(lambda: any(t["key"] == UNSCHEDULABLE_TAINT["key"]
                                for t in swapnode_taints(kubectl, node_name)),
                    f"the taint in SwapNode {node_name}", 30)  # fmt: skip
    elif argv[1:3] == ("get", "md"):
        # "wait until only models that tolerate the taint are left there": the grep's lines
        # are the tolerating model's alone.
        def left() -> bool:
            listed = kubectl.run(*argv[1:], check=True).stdout.splitlines()
            rows = [line.split()[1] for line in listed if node_name in line.split()]
            return rows == ["stays"]

        await until(left, f"only the tolerating model left on {node_name}")
        await wait_ready(objects, "moves")
    elif "--field-selector" in argv:
        return  # pods: the emulator runs none (test_operations_doc.py checks their selector)
    elif argv[1] == "uncordon":
        kubectl.run(*argv[1:], check=True)
        kept = [t for t in node_taints(kubectl, node_name)
                if t["key"] != UNSCHEDULABLE_TAINT["key"]]  # fmt: skip
        kubectl.run("patch", "node", node_name, "-p",
                    json.dumps({"spec": {"taints": kept or None}}), check=True)  # fmt: skip
        await until(lambda: not swapnode_taints(kubectl, node_name),
                    f"SwapNode {node_name} without the taint", 30)  # fmt: skip
    else:
        raise AssertionError(f"no step for {argv}")


# -- uninstalling without the hook ----------------------------------------------------------


@pytest.mark.timeout(600)
async def test_uninstall_without_the_hook_as_the_doc_gives_it(tmp_path: Path) -> None:
    """The doc's hook-less block: `modelswap uninstall` with the admin's kubeconfig (the
    test plays the Deployment controller: the operator pod stops once it is scaled to 0),
    `helm uninstall --no-hooks`, then `kubectl delete md --all -A`, which completes with no
    operator. Without `--kubeconfig` the command does not read KUBECONFIG, as the doc says."""
    by_hand = block_with("modelswap", "uninstall")
    (manual,) = [c for c in by_hand if c.argv[:2] == ("modelswap", "uninstall")]
    (no_hooks,) = [c for c in by_hand if c.argv[:2] == ("helm", "uninstall")]
    assert "--no-hooks" in no_hooks.argv
    (delete_all,) = [c for c in by_hand if c.argv[:3] == ("kubectl", "delete", "md")]
    ports = Ports.pick()
    with EmulatorThread(tls=True) as api:
        release = install(api, chart_values(ports), tmp_path)
        cluster = Cluster(api)
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": NODE, "labels": {"modelswap.io/pool": POOL,
                                     "kubernetes.io/hostname": NODE}}})  # fmt: skip
        # The admin's kubeconfig for the doc's; its namespace is this release's too.
        mapping = {"~/.kube/config": str(api.kubeconfig_path)}
        assert option(manual.argv, "--operator-namespace") == NAMESPACE, manual.argv
        with operator(api, release, tmp_path / "operator") as operator_pod:
            await until(lambda: cluster.secret("modelswap-control-token"),
                        "the operator to create the control token Secret")  # fmt: skip
            async with node_pod(api, release, NODE):
                kubectl.run("apply", "-f", str(EXAMPLE), check=True)
                await chart_ready(cluster, "classify")

                # As written but for --kubeconfig, with KUBECONFIG set: refused, nothing done.
                argv = list(manual.substituted(mapping).argv)
                argv[argv.index("--release") + 1] = RELEASE
                at = argv.index("--kubeconfig")
                without = [str(MODELSWAP), *argv[1:at], *argv[at + 2 :]]
                refused = await asyncio.to_thread(
                    subprocess.run, without, env=child_env(KUBECONFIG=str(api.kubeconfig_path)),
                    capture_output=True, text=True, timeout=60, check=False,
                )  # fmt: skip
                assert refused.returncode == 2, refused.stderr
                assert "cannot use the in-cluster config" in refused.stderr, refused.stderr
                assert _replicas(cluster) == 1

                process = Process([str(MODELSWAP), *argv[1:]], tmp_path / "uninstall.log",
                                  child_env())  # fmt: skip
                try:
                    await until(lambda: _replicas(cluster) == 0, "the operator scaled to 0", 60)
                    operator_pod.stop()  # the Deployment controller and the kubelet
                    await until(lambda: not process.running(), "modelswap uninstall to end", 60)
                finally:
                    code = process.stop()
                assert code == 0, process.log_tail()
                assert "classify released" in process.log_tail(), process.log_tail()

                args = list(no_hooks.substituted(mapping).argv[2:])
                args[args.index("modelswap")] = RELEASE
                done = await asyncio.to_thread(
                    subprocess.run, [str(HELM), "uninstall", *args], env=helm_env(api),
                    capture_output=True, text=True, timeout=120, check=False,
                )  # fmt: skip
                assert done.returncode == 0, done.stderr
                assert f'release "{RELEASE}" uninstalled' in done.stdout, done.stdout

        # No hook ran; the model says why it is not served; no route is left.
        assert client.BatchV1Api(cluster.client).list_namespaced_job(NAMESPACE).items == []
        model = cluster.model("classify") or {}
        ready = {c["type"]: c for c in model["status"]["conditions"]}["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "OperatorUninstalled"), ready
        managed = "app.kubernetes.io/managed-by=modelswap"
        assert cluster.core.list_service_for_all_namespaces(label_selector=managed).items == []
        assert (
            cluster.discovery.list_endpoint_slice_for_all_namespaces(label_selector=managed).items
            == []
        )
        deleted = kubectl.run(*delete_all.argv[1:], "--timeout=30s")
        assert deleted.returncode == 0, deleted.stderr
        assert "classify" in deleted.stdout, deleted.stdout
        assert cluster.model("classify") is None
        cluster.client.close()


# -- source credentials: changing who opted in, with helm upgrade ---------------------------


@pytest.fixture
def source_url() -> Iterator[str]:
    """The install test's http source: the archive only for SOURCE_AUTHORIZATION."""
    _Sources.archive = mlp_archive()
    _Sources.authorizations = []
    with served(_Sources) as url:
        yield url


def fetched_condition(cluster: Cluster, namespace: str, kind: str) -> dict[str, Any]:
    return opt_in_condition(cluster, namespace, kind)


def ready_in(cluster: Cluster, name: str, namespace: str) -> bool:
    conditions = ((cluster.model(name, namespace) or {}).get("status") or {}).get("conditions")
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions or ())


@pytest.mark.timeout(600)
async def test_switching_to_opt_in_and_opting_a_namespace_in_with_helm_upgrade(
    tmp_path: Path, source_url: str
) -> None:
    """The doc's "Source credentials" as a running install changes: from `access: cluster` to
    `optIn` listing team-a (the doc's `helm upgrade`, the operator rolled from the new
    manifests), team-b's loaded model keeps serving, `Loaded=True, CredentialsNotOptedIn`;
    a second upgrade adding team-b (its RoleBinding and the operator's argument together)
    and team-b's Secret is read again (Loaded back to Resident), and a new model there
    loads with it."""
    command = upgrade_command()
    ports = Ports.pick()
    cluster_wide = opt_in_values(ports)
    cluster_wide["operator"]["credentials"] = {"access": "cluster"}
    with EmulatorThread(tls=True) as api:
        seed(api)
        release = install(api, cluster_wide, tmp_path)
        cluster = Cluster(api)
        surges: list[OperatorPod] = []
        try:
            async with agents(api, tmp_path, names=(OPT_IN_NODE,)):
                with operator(api, release, tmp_path / "operator") as old_pod:
                    cluster.custom.create_namespaced_custom_object(
                        GROUP, VERSION, NOT_OPTED_IN, "modeldeployments",
                        model_in(NOT_OPTED_IN, source_url),
                    )  # fmt: skip
                    await until(lambda: fetched_condition(cluster, NOT_OPTED_IN, "Ready")
                                .get("status") == "True", f"{NOT_OPTED_IN}/fetched Ready", 120)  # fmt: skip
                    address, port = slice_address(cluster.discovery.read_namespaced_endpoint_slice(
                        "fetched-modelswap", NOT_OPTED_IN))  # fmt: skip
                    host = f"fetched.{NOT_OPTED_IN}.svc"

                    # To optIn with team-a alone: team-b's model keeps serving.
                    narrow = opt_in_values(ports)
                    surge, release = await upgrade(api, release, command=command, changed=narrow,
                                                   tmp_path=tmp_path, old_pod=old_pod)  # fmt: skip
                    surges.append(surge)
                    assert not [b for b in release.all("RoleBinding")
                                if b["metadata"].get("namespace") == NOT_OPTED_IN]  # fmt: skip
                    loaded = await until(lambda: told(cluster, NOT_OPTED_IN),
                                         f"{NOT_OPTED_IN}/fetched told it did not opt in", 60)  # fmt: skip
                    assert loaded["status"] == "True", loaded
                    assert fetched_condition(cluster, NOT_OPTED_IN, "Ready")["status"] == "True"
                    await mlp_answers(address, port, host, "fetched")

                    # Opting team-b in: the RoleBinding and the argument roll out together.
                    both = opt_in_values(ports)
                    both["operator"]["credentials"]["namespaces"] = [OPTED_IN, NOT_OPTED_IN]
                    surge, release = await upgrade(api, release, command=command, changed=both,
                                                   tmp_path=tmp_path, old_pod=surge)  # fmt: skip
                    surges.append(surge)
                    assert [b for b in release.all("RoleBinding")
                            if b["metadata"].get("namespace") == NOT_OPTED_IN]  # fmt: skip
                    assert f"--credentials-namespace={NOT_OPTED_IN}" in surge.container["args"]
                    await until(lambda: fetched_condition(cluster, NOT_OPTED_IN, "Loaded")
                                .get("reason") == "Resident", "Loaded back to Resident", 60)  # fmt: skip
                    # A new model there loads: only with the Secret's value (the source refuses
                    # a fetch without it, and the agent's cache keeps copies per credential).
                    later = model_in(NOT_OPTED_IN, source_url)
                    later["metadata"]["name"] = later["spec"]["model"]["name"] = "later"
                    cluster.custom.create_namespaced_custom_object(
                        GROUP, VERSION, NOT_OPTED_IN, "modeldeployments", later)  # fmt: skip
                    await until(lambda: ready_in(cluster, "later", NOT_OPTED_IN),
                                f"{NOT_OPTED_IN}/later Ready", 120)  # fmt: skip
                    assert set(_Sources.authorizations) <= {SOURCE_AUTHORIZATION}
                    await mlp_answers(address, port, host, "fetched")
        finally:
            for surge in surges:
                surge.stop()
        cluster.client.close()
