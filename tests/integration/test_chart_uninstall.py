"""`helm uninstall` of a release serving a model (issue 27, item 7): the chart's pre-delete
hook Job (`modelswap uninstall`, with the hook's own ServiceAccount and nothing more)
stops the operator, marks the model Ready=False, removes its finalizer and deletes its
Service and EndpointSlice; helm then removes the release. Afterwards the ModelDeployment
is still there (the CRD is kept) and `kubectl delete` completes with no operator; nothing
of the release, its hook or its routes is left.

The emulator runs no controllers, so the test plays the kubelet and the Job controller:
it runs the Job's container (its rendered command and args, a token minted for the
hook's ServiceAccount), stops the operator pod once the hook scaled its Deployment to 0,
and writes the Job's Complete condition when the container exits 0."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.integration.test_chart_install import Cluster, wait_ready
from tests.support.chart_node import node_pod
from tests.support.chart_world import (
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
    chart_values,
    child_env,
    helm_env,
    install,
    operator,
)
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import REPO_ROOT, Kubectl
from tests.support.waiting import until

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

EXAMPLE = REPO_ROOT / "examples" / "toy" / "classify-drop-on-idle.yaml"
HOOK = f"{OPERATOR}-uninstall"
MANAGED = "app.kubernetes.io/managed-by=modelswap"


def _replicas(cluster: Cluster) -> int | None:
    apps = client.AppsV1Api(cluster.client)
    try:
        return int(apps.read_namespaced_deployment(OPERATOR, NAMESPACE).spec.replicas)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def _job(cluster: Cluster) -> Any:
    try:
        return client.BatchV1Api(cluster.client).read_namespaced_job(HOOK, NAMESPACE)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


async def play_the_hook(api: EmulatorThread, cluster: Cluster, operator_pod: OperatorPod,
                        folder: Path) -> str:  # fmt: skip
    """Run the hook Job as a kubelet would; answers its container's log."""
    job = await until(lambda: _job(cluster), "helm to create the uninstall hook Job", 60)
    pod = job.spec.template.spec
    (container,) = pod.containers
    assert container.command == ["modelswap", "uninstall"]
    kubeconfig = api.write_kubeconfig_for(NAMESPACE, pod.service_account_name)
    process = Process([str(MODELSWAP), "uninstall", *container.args], folder / "hook.log",
                      child_env(MODELSWAP_KUBECONFIG=str(kubeconfig)))  # fmt: skip
    try:
        # The Deployment controller and the kubelet: replicas 0 -> the operator pod stops.
        await until(lambda: _replicas(cluster) == 0, "the hook to scale the operator to 0", 60)
        operator_pod.stop()
        await until(lambda: not process.running(), "the hook's container to exit", 60)
    finally:
        code = process.stop()
    log = process.log_tail()
    assert code == 0, f"hook exit status {code}: {log}"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    done = [{"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("SuccessCriteriaMet", "Complete")]  # fmt: skip
    client.BatchV1Api(cluster.client).patch_namespaced_job_status(HOOK, NAMESPACE, {"status": {
        "startTime": now, "completionTime": now, "succeeded": 1, "conditions": done}})  # fmt: skip
    return log


def _conditions(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (model.get("status") or {}).get("conditions") or ()}


@pytest.mark.timeout(600)
async def test_helm_uninstall_releases_every_model_and_leaves_nothing_undeletable(
    tmp_path: Path,
) -> None:
    ports = Ports.pick()
    with EmulatorThread(tls=True) as api:
        release = install(api, chart_values(ports), tmp_path)
        cluster = Cluster(api)
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": NODE, "labels": {"modelswap.io/pool": POOL,
                                     "kubernetes.io/hostname": NODE}}})  # fmt: skip
        with operator(api, release, tmp_path / "operator") as operator_pod:
            await until(lambda: cluster.secret("modelswap-control-token"),
                        "the operator to create the control token Secret")  # fmt: skip
            async with node_pod(api, release, NODE):
                kubectl.run("apply", "-f", str(EXAMPLE), check=True)
                await wait_ready(cluster, "classify")
                before = cluster.model("classify") or {}
                assert "modelswap.io/finalizer" in before["metadata"]["finalizers"]
                cluster.core.read_namespaced_service("classify", "default")
                cluster.discovery.read_namespaced_endpoint_slice("classify-modelswap", "default")

                uninstall = await asyncio.create_subprocess_exec(
                    str(HELM), "uninstall", RELEASE, "-n", NAMESPACE, "--timeout", "180s",
                    env=helm_env(api), stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )  # fmt: skip
                try:
                    hook_log = await play_the_hook(api, cluster, operator_pod, tmp_path)
                    out, err = await asyncio.wait_for(uninstall.communicate(), 120)
                finally:
                    if uninstall.returncode is None:
                        uninstall.kill()
                        await uninstall.wait()
                assert uninstall.returncode == 0, err.decode()
                assert f'release "{RELEASE}" uninstalled' in out.decode()
                assert "classify released (finalizer removed, 2 routes deleted)" in hook_log

        # The model is still there, says why it is not served, and can be deleted.
        model = cluster.model("classify") or {}
        assert "modelswap.io/finalizer" not in (model["metadata"].get("finalizers") or [])
        ready = _conditions(model)["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "OperatorUninstalled"), ready
        assert cluster.core.list_service_for_all_namespaces(label_selector=MANAGED).items == []
        slices = cluster.discovery.list_endpoint_slice_for_all_namespaces(label_selector=MANAGED)
        assert slices.items == []
        kubectl.run("delete", "md", "classify", "--timeout=30s", check=True)
        assert cluster.model("classify") is None
        # Nothing of the release or its hook is left in its namespace.
        left = {
            "jobs": client.BatchV1Api(cluster.client).list_namespaced_job(NAMESPACE).items,
            "deployments": client.AppsV1Api(cluster.client)
            .list_namespaced_deployment(NAMESPACE)
            .items,
            "serviceaccounts": [
                sa
                for sa in cluster.core.list_namespaced_service_account(NAMESPACE).items
                if sa.metadata.name != "default"
            ],
            "roles": client.RbacAuthorizationV1Api(cluster.client)
            .list_namespaced_role(NAMESPACE)
            .items,
            "clusterroles": [
                r
                for r in client.RbacAuthorizationV1Api(cluster.client).list_cluster_role().items
                if r.metadata.name.startswith(OPERATOR)
            ],
        }
        assert {k: [o.metadata.name for o in v] for k, v in left.items() if v} == {}
        cluster.client.close()
