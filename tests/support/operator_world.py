"""A small cluster for the operator's integration tests: the API emulator (in a thread),
three real agents with real Triton (sim GPUs, each its own Node, SwapNode and Lease), and
the operator under `kopf.testing.KopfRunner`.

The emulator creates no namespaces or Nodes: `cluster()` does. Every process is torn down
by the context managers (agents and Tritons by `agent_harness.node`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import kopf
import yaml
from kopf.testing import KopfRunner
from kubernetes import client

from modelswap_api import kube
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.tls import pinned_context
from modelswap_operator.handlers import configure, register
from modelswap_operator.login import connection_info
from modelswap_operator.runtime import Runtime
from modelswap_operator.settings import OperatorSettings
from modelswap_sidecar.triton.process import free_loopback_port
from tests.support.agent_harness import MIB, TOKEN, AgentConfig, Node, eventually, node
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import REPO_ROOT, load_yaml

GROUP, VERSION, PLURAL = "modelswap.io", "v1alpha1", "modeldeployments"
OPERATOR_NAMESPACE = "modelswap-system"
NODE_LEASES = "modelswap-node-leases"
GRACE_SECONDS = 3.0
NODES = ("node-a", "node-b", "node-c")


#: Cluster defaults sized for the agents' 1 GiB test host stores (the built-in host KV tier
#: alone is 1 GiB).
DEFAULTS = {**BUILTIN_DEFAULTS, "kvCache": {"offloadAfterTokens": 4096, "hostBytes": "64Mi"}}


def write_defaults(folder: Path) -> Path:
    """DEFAULTS as a file for `modelswap operator --defaults`."""
    path = folder / "defaults.yaml"
    path.write_text(yaml.safe_dump(DEFAULTS))
    return path


def settings(api: EmulatorThread, **overrides: Any) -> OperatorSettings:
    base = OperatorSettings(
        defaults=DEFAULTS,
        kubeconfig=api.kubeconfig_path,
        namespace=OPERATOR_NAMESPACE,
        identity="operator-test",
        leader_lease_seconds=2,
        leader_renew_seconds=0.4,
        node_lease_namespace=NODE_LEASES,
        grace_seconds=GRACE_SECONDS,
        batch_seconds=0.1,
        tick_seconds=0.3,
        http_port=0,
        json_logs=False,
    )
    return replace(base, **overrides)


def cluster_objects(namespaces: tuple[str, ...] = ("default",)) -> list[dict[str, Any]]:
    """CRDs, namespaces, Nodes and the control token Secret the agents also read."""
    objects: list[dict[str, Any]] = [
        load_yaml(path) for path in sorted((REPO_ROOT / "crds").glob("*.yaml"))
    ]
    for name in (*namespaces, OPERATOR_NAMESPACE, NODE_LEASES):
        if name == "default":  # the emulator has it
            continue
        objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    for name in NODES:
        objects.append({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": name, "labels": {"pool": "sim",
                                                              "kubernetes.io/hostname": name}}})  # fmt: skip
    objects.append({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "modelswap-control-token", "namespace": OPERATOR_NAMESPACE},
        "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
    })  # fmt: skip
    return objects


@contextlib.contextmanager
def emulator(
    namespaces: tuple[str, ...] = ("default",), **options: Any
) -> Iterator[EmulatorThread]:
    """The emulator seeded with `cluster_objects`; `options` go to `KubeEmulator` (e.g.
    `faults=`: injected faults start with the first request after the seeding)."""
    with EmulatorThread(**options) as api:
        for body in cluster_objects(namespaces):
            api.create(body)
        yield api


def agent_config(
    api: EmulatorThread,
    node_name: str,
    *,
    status_interval_seconds: float = 1.0,
    kube_settings: dict[str, Any] | None = None,
) -> AgentConfig:
    """`kube_settings`: more of the agent's `kube` section (e.g. `nodeRefreshSeconds`)."""
    return AgentConfig(
        local_mode=False,
        grace_seconds=GRACE_SECONDS,
        gpu_bytes=(256 * MIB, 256 * MIB),
        extra={
            "nodeName": node_name,
            "gpus": [
                {"uuid": f"{node_name}-gpu-{i}", "capacityBytes": 256 * MIB, "linkGBps": 10.0}
                for i in range(2)
            ],
            "gateway": {"host": "127.0.0.1", "port": free_loopback_port()},
            "kube": {
                "kubeconfig": str(api.kubeconfig_path),
                "leaseNamespace": NODE_LEASES,
                "holderIdentity": f"agent-{node_name}",
                "advertiseHost": "127.0.0.1",
                "leaseDurationSeconds": 2,
                "renewIntervalSeconds": 0.3,
                "statusIntervalSeconds": status_interval_seconds,
                "minStatusWriteIntervalSeconds": 0,
                **(kube_settings or {}),
            },
        },
    )


@contextlib.asynccontextmanager
async def agents(
    api: EmulatorThread,
    tmp_path: Path,
    names: tuple[str, ...] = NODES,
    *,
    status_interval_seconds: float = 1.0,
    kube_settings: dict[str, Any] | None = None,
) -> AsyncIterator[dict[str, Node]]:
    async with contextlib.AsyncExitStack() as stack:
        started = {}
        for name in names:
            workdir = tmp_path / name
            workdir.mkdir()
            started[name] = await stack.enter_async_context(
                node(
                    workdir,
                    agent_config(
                        api,
                        name,
                        status_interval_seconds=status_interval_seconds,
                        kube_settings=kube_settings,
                    ),
                )
            )
        kube_api = kube.api_client(str(api.kubeconfig_path))
        for name, running in started.items():
            # The test's own control client pins the certificate the SwapNode publishes,
            # as the operator does.
            status = await eventually(
                lambda n=name: _async_status(kube_api, n), what=f"SwapNode {name}'s certificate"
            )
            await running.control.switch_to(
                status["endpoint"], verify=pinned_context(status["certificate"])
            )
        yield started


async def _async_status(api: Any, name: str) -> dict[str, Any] | None:
    swapnode = await asyncio.to_thread(kube.read_swapnode, api, name)
    status: dict[str, Any] = (swapnode or {}).get("status") or {}
    return status if status.get("certificate") and status.get("endpoint") else None


@dataclass
class RunningOperator:
    runtime: Runtime
    runner: KopfRunner


@contextlib.contextmanager
def operator(api: EmulatorThread, **overrides: Any) -> Iterator[RunningOperator]:
    """The operator under KopfRunner (kopf's CLI in a thread), watching every namespace."""
    runtime = Runtime(settings(api, **overrides))
    registry = kopf.OperatorRegistry()
    register(registry, runtime, login=lambda **_: connection_info(runtime.api))
    kopf_settings = kopf.OperatorSettings()
    configure(kopf_settings)
    args = ["run", "--standalone", "--all-namespaces"]
    with KopfRunner(args, registry=registry, settings=kopf_settings, timeout=60) as runner:
        yield RunningOperator(runtime, runner)
    assert runner.exception is None, runner.exception


class Objects:
    """ModelDeployments, Services, EndpointSlices and Events through the official client."""

    def __init__(self, api: EmulatorThread) -> None:
        from tests.support.kube_testing import api_client

        self._client = api_client(api.kubeconfig_path)
        self.custom = client.CustomObjectsApi(self._client)
        self.core = client.CoreV1Api(self._client)
        self.discovery = client.DiscoveryV1Api(self._client)

    def close(self) -> None:
        self._client.close()

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        namespace = body["metadata"].get("namespace", "default")
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body
        )
        return created

    def get(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            )
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        return found

    def patch(self, name: str, patch: dict[str, Any], namespace: str = "default") -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)

    def delete(self, name: str, namespace: str = "default") -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def condition(self, name: str, kind: str, namespace: str = "default") -> dict[str, Any]:
        status = (self.get(name, namespace) or {}).get("status") or {}
        for condition in status.get("conditions") or ():
            if condition["type"] == kind:
                found: dict[str, Any] = condition
                return found
        return {}

    def endpoint_slice(self, name: str, namespace: str = "default") -> Any:
        return self.discovery.read_namespaced_endpoint_slice(f"{name}-modelswap", namespace)

    def events(self, name: str, namespace: str = "default") -> list[tuple[str, str]]:
        found = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        )
        return [(e.reason, e.message) for e in found.items]
