"""The chart as installed: `helm install` of charts/modelswap into the authorizing API
emulator (`EmulatorThread(tls=True)`), then the real operator and the real agent started
from what the release rendered -- their commands, environment and settings files -- with
kubeconfigs minted for the chart's own ServiceAccounts, so they hold exactly the rights the
chart grants.

Nothing runs the Deployment or the DaemonSet here, so this module plays the kubelet:

- the downward-API values (pod name, namespace, node name, pod IP) are substituted, and
  `$(VAR)` in arguments is expanded as the kubelet does;
- every volume is a folder: a ConfigMap's or Secret's keys become files (a Secret's with
  its `defaultMode`), an emptyDir an empty folder under the pod's work dir, a hostPath the
  path itself; a path in a settings file under a mount path is moved to that folder;
- the in-cluster service account (the token file under /var/run/secrets, the API address
  from the Service env) becomes a kubeconfig holding a token minted for the pod's
  ServiceAccount (`api.write_kubeconfig_for`), node-bound for the node pod.

The node pod is `chart_node.NodePod`: its PID 1, the real supervisor, runs the agent and
Triton from the rendered node.yaml, under their own uids when the test runs as root.

Every process runs in its own process group and is killed as a group.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client

from modelswap_sidecar.triton.process import free_loopback_port
from tests.support.agent_harness import spawn
from tests.support.kube_emulator.audit import RequestRecord
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import REPO_ROOT, api_client

T = TypeVar("T")
HELM = REPO_ROOT / ".venv" / "bin" / "helm"
#: The images' entrypoint (`modelswap operator`, `modelswap node`) is this console script.
MODELSWAP = REPO_ROOT / ".venv" / "bin" / "modelswap"
CHART = REPO_ROOT / "charts" / "modelswap"
MODELS = REPO_ROOT / "examples" / "models"
RELEASE = "ms"
NAMESPACE = "modelswap-system"
NODE_LEASES = "modelswap-node-leases"
POOL = "cpu"
#: The node the agent runs on, and one with no agent (whose objects it must not write).
NODE, OTHER_NODE = "node-a", "node-b"
OPERATOR = f"{RELEASE}-modelswap-operator"
NODE_OBJECTS = f"{RELEASE}-modelswap-node"  # the node ServiceAccount, roles, policy
OPERATOR_POD = f"{OPERATOR}-6d5f8c7b9-x2k4q"
NODE_POD = f"{NODE_OBJECTS}-{POOL}-h7m2v"
#: The pod IP: plain loopback (one agent, so its fixed ports cannot collide).
POD_IP = "127.0.0.1"


@dataclass(frozen=True)
class Ports:
    """Free loopback ports for the chart's port values (the defaults, 8080/9443/9090, may
    be taken on a shared machine)."""

    gateway: int
    control: int
    metrics: int
    operator_http: int
    #: the gateway's gRPC front (`node.ports.gatewayGrpc`)
    gateway_grpc: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(*(free_loopback_port() for _ in range(5)))


def chart_values(ports: Ports, *, grace_seconds: int = 10) -> dict[str, Any]:
    """Values for this test: the sim backend on one pool of two small simulated GPUs, the
    example models mounted from examples/models at /models, free ports, and short leases so
    a restart or a takeover takes seconds, not the production minutes."""
    return {
        "graceSeconds": grace_seconds,
        "policyDefaults": {
            "swapPolicy": {"idleAfter": "10m", "minResident": "1m", "priority": 100,
                           "pinned": False, "onSwapOut": "host", "kv": "discard"},
            # The built-in 1Gi host KV tier would not fit the small host store below.
            "kvCache": {"offloadAfterTokens": 4096, "hostBytes": "64Mi"},
            "gateway": {"maxQueued": 100, "queueTimeout": "60s"},
        },
        "operator": {"replicas": 1, "leaderLeaseSeconds": 4, "leaderRenewSeconds": 1,
                     "httpPort": ports.operator_http, "deadNodeRetentionSeconds": 3},
        "node": {
            "backend": "sim",
            "hbmReservePerGpu": "0",
            "simGpuCapacity": "256Mi",
            "hostStorePerGpu": "1Gi",
            "memoryOverhead": "1Gi",
            "sourceCache": {"capacity": "64Mi", "maxDownload": "16Mi"},
            "modelSources": [{"name": "models", "mountPath": "/models",
                              "volume": {"hostPath": {"path": str(MODELS),
                                                      "type": "Directory"}}}],
            "ports": {"gateway": ports.gateway, "control": ports.control,
                      "metrics": ports.metrics, "gatewayGrpc": ports.gateway_grpc},
            "heartbeat": {"leaseDurationSeconds": 4, "renewIntervalSeconds": 1},
        },
        "nodePools": [{"name": POOL, "gpus": 2, "nodeSelector": {"modelswap.io/pool": POOL},
                       "tolerations": []}],
    }  # fmt: skip


# -- helm ---------------------------------------------------------------------------------------


def helm_env(api: EmulatorThread) -> dict[str, str]:
    home = api.home
    return dict(os.environ, KUBECONFIG=str(api.kubeconfig_path), HOME=str(home),
                HELM_CACHE_HOME=str(home / "cache"), HELM_CONFIG_HOME=str(home / "config"),
                HELM_DATA_HOME=str(home / "data"))  # fmt: skip


def helm(api: EmulatorThread, *args: str) -> str:
    done = subprocess.run([str(HELM), *args], env=helm_env(api), capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done.stdout


@dataclass(frozen=True)
class Release:
    """The objects the installed release holds (`helm get manifest`)."""

    objects: list[dict[str, Any]]

    def find(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.objects
                 if o["kind"] == kind and name in (None, o["metadata"]["name"])]  # fmt: skip
        assert len(found) == 1, f"{kind} {name}: {len(found)} found"
        return found[0]

    def all(self, *kinds: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] in kinds]

    def pod(self, kind: str, name: str) -> dict[str, Any]:
        spec: dict[str, Any] = self.find(kind, name)["spec"]["template"]["spec"]
        return spec


def install(api: EmulatorThread, values: Mapping[str, Any], folder: Path) -> Release:
    """`helm install` the chart (CRDs included) as the cluster admin, as a user would."""
    path = folder / "values.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    helm(api, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
         "-f", str(path))  # fmt: skip
    manifest = helm(api, "get", "manifest", RELEASE, "-n", NAMESPACE)
    return Release([d for d in yaml.safe_load_all(manifest) if d])


# -- playing the kubelet ------------------------------------------------------------------------


def downward_env(container: Mapping[str, Any], fields: Mapping[str, str]) -> dict[str, str]:
    """The container's env with each fieldRef resolved from `fields` (a fieldRef this pod
    does not know fails the test: the chart would need a value nobody gives here)."""
    env = {}
    for item in container.get("env") or ():
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def expand(arg: str, env: Mapping[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion of container arguments."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)


class Mounts:
    """The container's volumeMounts as folders of this machine (see the module docstring)."""

    def __init__(
        self,
        api: EmulatorThread,
        namespace: str,
        pod: Mapping[str, Any],
        container: Mapping[str, Any],
        root: Path,
        *,
        skip: tuple[str, ...] = ("/dev/shm", "/tmp"),
    ) -> None:
        volumes = {v["name"]: v for v in pod.get("volumes") or ()}
        self.api = api
        self.namespace = namespace
        self.root = root
        #: The pod's fsGroup, applied as the kubelet does when this process may chown
        #: (root): volumes' files group-owned by it.
        fs_group = (pod.get("securityContext") or {}).get("fsGroup")
        self.fs_group: int | None = fs_group if os.geteuid() == 0 else None
        #: mountPath -> (local folder, volume)
        self.mounts: dict[str, tuple[Path, dict[str, Any]]] = {}
        for mount in container.get("volumeMounts") or ():
            if mount["mountPath"] in skip:  # the machine's own /dev/shm and /tmp serve
                continue
            volume = volumes[mount["name"]]
            if "hostPath" in volume:
                local = Path(volume["hostPath"]["path"])
            else:
                local = root / mount["name"]
                local.mkdir(parents=True, exist_ok=True)
                # An emptyDir is world-writable (setgid to the fsGroup); a projected
                # volume's folder is readable by all, its files as their mode says.
                local.chmod(0o777 if "emptyDir" in volume else 0o755)
                if self.fs_group is not None:
                    os.chown(local, 0, self.fs_group)
                    if "emptyDir" in volume:
                        local.chmod(0o2777)
            self.mounts[mount["mountPath"]] = (local, volume)

    def local(self, path: str) -> str:
        """`path` as seen inside the container → the same file here (longest mount first)."""
        for mount_path in sorted(self.mounts, key=len, reverse=True):
            if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
                folder, _ = self.mounts[mount_path]
                return str(folder) + path[len(mount_path.rstrip("/")) :]
        return path

    def project(self) -> list[str]:
        """Write every ConfigMap and Secret volume's keys as the kubelet would; answer the
        volumes still missing (an optional Secret not created yet)."""
        missing = []
        with api_client(self.api.kubeconfig_path) as admin:
            core = client.CoreV1Api(admin)
            for folder, volume in self.mounts.values():
                if "configMap" in volume:
                    name = volume["configMap"]["name"]
                    data = core.read_namespaced_config_map(name, self.namespace).data or {}
                    for key, text in data.items():
                        (folder / key).write_text(text)
                        self._own(folder / key)
                elif "secret" in volume:
                    name = volume["secret"]["secretName"]
                    try:
                        secret = core.read_namespaced_secret(name, self.namespace)
                    except client.ApiException as e:
                        if e.status != 404 or not volume["secret"].get("optional"):
                            raise
                        missing.append(name)
                        continue
                    mode = int(volume["secret"].get("defaultMode", 0o644))
                    for key, encoded in (secret.data or {}).items():
                        target = folder / key
                        with contextlib.suppress(FileNotFoundError):
                            target.unlink()
                        target.write_bytes(base64.b64decode(encoded))
                        target.chmod(mode)
                        self._own(target)
        return missing

    def _own(self, path: Path) -> None:
        if self.fs_group is not None:
            os.chown(path, 0, self.fs_group)


def local_paths(value: Any, mounts: Mounts) -> Any:
    """Every string value (not mapping keys: modelRoots' keys are URI prefixes) under a
    mount path, moved to the mount's folder here."""
    if isinstance(value, dict):
        return {k: local_paths(v, mounts) for k, v in value.items()}
    if isinstance(value, list):
        return [local_paths(v, mounts) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        return mounts.local(value)
    return value


# -- processes ----------------------------------------------------------------------------------


class Process:
    """A child in its own process group, its output in `log_path`."""

    def __init__(self, command: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.command = command
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] = spawn(command, log_path, env=env)

    def running(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    def stop(self, timeout_seconds: float = 20.0) -> int | None:
        """SIGTERM to the group, SIGKILL to it after the timeout; the exit status (None when
        it had to be killed)."""
        if self.popen.poll() is not None:
            return self.popen.returncode
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            return self.popen.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)
            return None


def child_env(**extra: str) -> dict[str, str]:
    """This environment, without proxies (a proxy must not see loopback fetches) and
    without the in-cluster Service variables a pod would have."""
    env = {k: v for k, v in os.environ.items()
           if not k.lower().endswith("_proxy") and not k.startswith("KUBERNETES_")}  # fmt: skip
    return {**env, **extra}


class OperatorPod:
    """An operator pod's one container: its rendered args and env, its ConfigMap mounted,
    its ServiceAccount's token in place of the in-cluster credentials. Restartable: each
    start is a new pod (a new name, so a new leader term)."""

    def __init__(self, api: EmulatorThread, release: Release, folder: Path) -> None:
        pod = release.pod("Deployment", OPERATOR)
        (self.container,) = pod["containers"]
        assert "command" not in self.container  # the image's entrypoint: `modelswap operator`
        self.folder = folder
        self.mounts = Mounts(api, NAMESPACE, pod, self.container, folder)
        assert self.mounts.project() == []
        self.kubeconfig = api.write_kubeconfig_for(NAMESPACE, pod["serviceAccountName"])
        self.starts = 0
        self.process: Process | None = None

    def start(self) -> Process:
        self.starts += 1
        fields = {"metadata.name": f"{OPERATOR_POD}{self.starts}", "metadata.namespace": NAMESPACE}
        env = downward_env(self.container, fields)
        args = [_local_arg(expand(a, env), self.mounts) for a in self.container["args"]]
        # MODELSWAP_KUBECONFIG stands for the in-cluster config (`--kubeconfig`'s fallback).
        self.process = Process([str(MODELSWAP), "operator", *args],
                               self.folder / f"operator-{self.starts}.log",
                               child_env(**env, MODELSWAP_KUBECONFIG=str(self.kubeconfig)))  # fmt: skip
        return self.process

    def stop(self) -> None:
        """SIGTERM, as the kubelet stops a pod: exit status 0 (the Lease released)."""
        if self.process is not None:
            process, self.process = self.process, None
            code = process.stop()
            assert code == 0, f"operator exit status {code}: {process.log_tail()}"

    def log_tail(self, n: int = 12000) -> str:
        return self.process.log_tail(n) if self.process is not None else ""


@contextlib.contextmanager
def operator(api: EmulatorThread, release: Release, folder: Path) -> Iterator[OperatorPod]:
    """The operator pod, started; stopped after."""
    pod = OperatorPod(api, release, folder)
    pod.start()
    try:
        yield pod
    except BaseException:
        sys.stderr.write(f"--- operator log ---\n{pod.log_tail()}\n")
        raise
    finally:
        pod.stop()


def _local_arg(arg: str, mounts: Mounts) -> str:
    """`--flag=/mounted/path` → the same flag with the path here."""
    if "=" in arg:
        flag, value = arg.split("=", 1)
        return f"{flag}={mounts.local(value)}"
    return mounts.local(arg)


# -- rights -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """One (API group, resource, verb) of one rule, as a binding gives it to one user:
    everywhere (a ClusterRoleBinding) or in one namespace (a RoleBinding)."""

    role: str
    user: str
    namespace: str | None
    api_group: str
    resource: str
    verb: str
    names: tuple[str, ...]

    def allows(self, record: RequestRecord) -> bool:
        return (
            record.user == self.user
            and record.api_group == self.api_group
            and record.resource_with_subresource == self.resource
            and record.verb == self.verb
            and (not self.names or record.name in self.names)
            and self.namespace in (None, record.namespace)
        )

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        names = f" {list(self.names)}" if self.names else ""
        group = self.api_group or "core"
        return f"{self.role}: {self.verb} {group}/{self.resource}{names}{where}"


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def grants(release: Release) -> list[Grant]:
    """Every grant the release's bindings give its ServiceAccounts (wildcards are not
    expanded: the chart has none, and a test says so)."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in release.all("Role", "ClusterRole")}  # fmt: skip
    found = []
    for binding in release.all("RoleBinding", "ClusterRoleBinding"):
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace")
        role = roles[(ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])]
        label = f"{ref['kind']} {ref['name']}" + (f" ({binding['kind']} in {scope})"
                                                  if binding["kind"] == "RoleBinding" else "")  # fmt: skip
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            user = service_account_user(subject["namespace"], subject["name"])
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            assert "*" not in (group, resource, verb), rule
                            found.append(Grant(label, user, scope, group, resource, verb,
                                               tuple(rule.get("resourceNames") or ())))  # fmt: skip
    return found
