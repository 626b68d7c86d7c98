"""The Helm chart (charts/modelswap) with the real helm v3 and v4 binaries: lint, render,
schema validation of every object, refused values, and the rendered commands and settings
files read by the real settings code of the operator, the agent and the supervisor."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, latest_version

from modelswap_api.defaults import check_defaults
from modelswap_operator import command as operator_command
from modelswap_sidecar.agent import command as agent_command
from modelswap_sidecar.agent.settings.document import load_settings
from modelswap_sidecar.supervisor import command as node_command
from tests.support.dashboard import dashboard_metrics

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "modelswap"
BIN = Path(sys.executable).parent
HELMS = {"helm4": BIN / "helm", "helm3": BIN / "helm3"}
NAMESPACE = "modelswap-system"
OLDEST = "1.30.0"  # DESIGN.md §1: the minimum Kubernetes

# Value sets a user would plausibly install with.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "two-pools": {"nodePools": [
        {"name": "h100", "gpus": 8, "nodeSelector": {"gpu": "h100"}},
        {"name": "gh200", "gpus": 1, "nodeSelector": {"gpu": "gh200"}, "backend": "cuda-vmm",
         "hostStorePerGpu": "256Gi", "tolerations": [{"key": "gh200", "operator": "Exists"}]},
    ]},
    "dra": {"nodePools": [{"name": "gpu", "gpus": 4,
                           "dra": {"enabled": True, "deviceClassName": "gpu.nvidia.com"}}]},
    "monitoring": {"serviceMonitor": {"enabled": True}, "dashboard": {"enabled": True}},
    "no-crds": {"crds": {"enabled": False}, "operator": {"watchNamespaces": ["team-a", "b"]}},
    # The recommended install (docs/operations.md): credentials read only where opted in.
    "credentials-opt-in": {"operator": {"credentials": {"access": "optIn",
                                                        "namespaces": ["team-a", "team-c"]}}},
    "sim": {"node": {"backend": "sim", "modelSources": [
        {"name": "models", "mountPath": "/models",
         "volume": {"hostPath": {"path": "/srv/models", "type": "Directory"}}}]},
        "nodePools": [{"name": "cpu", "gpus": 2}], "networkPolicy": {"metrics": {"namespaces": []}}},
}  # fmt: skip

# Kinds kubernetes-validate has no schema for, and why that is expected.
NO_SCHEMA_ALLOWED = {
    ("ServiceMonitor", None),  # a Prometheus Operator CRD, never in Kubernetes' schemas
}


def helm(which: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HELMS[which]), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render(values: Mapping[str, Any], tmp: Path, which: str = "helm4") -> list[dict[str, Any]]:
    path = tmp / "values.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    done = helm(which, "template", "ms", str(CHART), "-n", NAMESPACE, "-f", str(path))
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render({}, tmp_path_factory.mktemp("render"))


@pytest.mark.slow
@pytest.mark.parametrize("which", sorted(HELMS))
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_helm_lint_strict(which: str, value_set: str, tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(VALUE_SETS[value_set]))
    done = helm(which, "lint", "--strict", str(CHART), "-n", NAMESPACE, "-f", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


# DRA (resource.k8s.io v1beta1/v1, and the pod's resourceClaims in that shape) needs
# Kubernetes 1.32+, so the DRA value set is checked against the newest version only.
SCHEMA_CASES = [
    (value_set, version)
    for value_set in sorted(VALUE_SETS)
    for version in (OLDEST, latest_version() + ".0")
    if not (value_set == "dra" and version == OLDEST)
]


@pytest.mark.slow
@pytest.mark.parametrize(("value_set", "version"), SCHEMA_CASES)
def test_rendered_objects_pass_kubernetes_schemas(
    value_set: str, version: str, tmp_path: Path
) -> None:
    objects = render(VALUE_SETS[value_set], tmp_path)
    missing = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except SchemaNotFoundError:
            kind = obj["kind"]
            if (kind, None) in NO_SCHEMA_ALLOWED:
                continue
            missing.append(f"{obj['apiVersion']}/{kind}")
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']} on {version}: {e}")
    assert not missing, f"no schema on {version} for {missing}"


def test_both_helms_render_the_same(tmp_path: Path) -> None:
    values = VALUE_SETS["two-pools"]
    assert render(values, tmp_path, "helm3") == render(values, tmp_path, "helm4")


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"node": {"backend": "gpu"}}, "/node/backend"),
        ({"node": {"hostStorePerGpu": "16GB"}}, "/node/hostStorePerGpu"),
        ({"nodePools": [{"name": "Bad_Name", "gpus": 1}]}, "/nodePools/0/name"),
        ({"nodePools": [{"name": "a", "gpus": 0}]}, "/nodePools/0/gpus"),
        ({"policyDefaults": {"swapPolicy": {"idleAfter": "soon"}}}, "/policyDefaults/swapPolicy/idleAfter"),
        ({"operator": {"replica": 2}}, "replica"),
        ({"graceSeconds": "90"}, "/graceSeconds"),
        ({"node": {"tritonPorts": {"http": 9090, "grpc": 8001}}}, "/node/tritonPorts"),
        ({"node": {"tritonPorts": {"http": 0, "grpc": 8001}}}, "/node/tritonPorts/http"),
        ({"operator": {"credentials": {"access": "namespaces", "namespaces": []}}},
         "/operator/credentials/access"),
        ({"operator": {"credentials": {"access": "optIn", "namespaces": ["Team_A"]}}},
         "/operator/credentials/namespaces/0"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_naming_the_key(
    values: dict[str, Any], key: str, tmp_path: Path
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    for which in HELMS:
        done = helm(which, "template", "ms", str(CHART), "-n", NAMESPACE, "-f", str(path))
        assert done.returncode != 0
        # helm v4 names '/node/backend', v3 'node.backend': accept either spelling.
        dotted = key.strip("/").replace("/", ".")
        assert key in done.stderr or dotted in done.stderr, done.stderr


def test_lease_namespace_must_not_be_the_release_namespace(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"nodeLeases": {"namespace": NAMESPACE}}))
    done = helm("helm4", "template", "ms", str(CHART), "-n", NAMESPACE, "-f", str(path))
    assert done.returncode != 0 and "nodeLeases.namespace" in done.stderr


def test_every_values_key_has_a_comment() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\s*[A-Za-z][\w.-]*:", line) and not line.lstrip().startswith("#"):
            above = lines[i - 1].strip() if i else ""
            assert above.startswith("#"), f"values.yaml:{i + 1}: {line.strip()} has no comment"


def test_chart_version_and_images_follow_the_project() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for part in ("operator", "node"):
        dockerfile = (ROOT / "images" / f"{part}.Dockerfile").read_text()
        assert f'org.opencontainers.image.title="modelswap-{part}"' in dockerfile
        assert values[part]["image"]["repository"] == f"modelswap-{part}"


def test_images_are_tagged_with_the_app_version(rendered: list[dict[str, Any]]) -> None:
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    deployment = find(rendered, "Deployment")
    daemonset = find(rendered, "DaemonSet")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"modelswap-operator:{version}"
    )
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"modelswap-node:{version}"
    )


def test_rendered_crds_equal_the_sources(tmp_path: Path) -> None:
    objects = render({}, tmp_path)
    for source in sorted((ROOT / "crds").glob("*.yaml")):
        wanted = yaml.safe_load(source.read_text())
        crd = find(objects, "CustomResourceDefinition", wanted["metadata"]["name"])
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert crd["apiVersion"] == wanted["apiVersion"] and crd["spec"] == wanted["spec"]
    unkept = render({"crds": {"keep": False}}, tmp_path)
    assert all("annotations" not in o["metadata"] for o in unkept if o["kind"].startswith("Cust"))
    none = render({"crds": {"enabled": False}}, tmp_path)
    assert not [o for o in none if o["kind"] == "CustomResourceDefinition"]


def test_sync_crds_leaves_the_tree_unchanged() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "sync_crds.py"), "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def test_operator_command_parses_with_the_real_settings(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    container = operator_container(rendered)
    defaults = yaml.safe_load(
        find(rendered, "ConfigMap", "ms-modelswap-operator")["data"]["defaults.yaml"]
    )
    assert check_defaults(defaults) == defaults
    (tmp_path / "defaults.yaml").write_text(yaml.safe_dump(defaults))
    args = [a.replace("/etc/modelswap/", f"{tmp_path}/") for a in container["args"]]
    parser = argparse.ArgumentParser()
    operator_command.register(parser.add_subparsers())
    parsed = parser.parse_args(["operator", *args])
    # The downward API's values, as the kubelet would set them.
    fields = {"metadata.name": "ms-modelswap-operator-7d9-abcde", "metadata.namespace": NAMESPACE}
    environ = {e["name"]: fields[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in container["env"]}
    settings = operator_command.settings_from(parsed, environ)
    assert settings.namespace == NAMESPACE
    assert settings.identity == "ms-modelswap-operator-7d9-abcde"
    assert settings.grace_seconds == 90
    assert settings.node_lease_namespace == "modelswap-node-leases"
    assert settings.defaults == defaults
    assert settings.namespaces == ()
    assert not settings.allow_plain_http
    probes = (container["livenessProbe"]["httpGet"]["path"],
              container["readinessProbe"]["httpGet"]["path"])  # fmt: skip
    assert probes == ("/healthz", "/healthz")  # /readyz would keep standbys unready forever
    assert container["ports"][0]["containerPort"] == settings.http_port


def test_policy_defaults_from_values_reach_the_operator(tmp_path: Path) -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["policyDefaults"]
    defaults["swapPolicy"]["idleAfter"] = "30m"
    objects = render({"policyDefaults": defaults}, tmp_path)
    operator = yaml.safe_load(
        find(objects, "ConfigMap", "ms-modelswap-operator")["data"]["defaults.yaml"]
    )
    assert check_defaults(operator)["swapPolicy"]["idleAfter"] == "30m"
    # The agents take each model's effective policy from the operator's pushes: their
    # settings carry no defaults of their own.
    agent = yaml.safe_load(
        find(objects, "ConfigMap", "ms-modelswap-node-gpu")["data"]["agent.yaml"]
    )
    assert "defaults" not in agent


def expand(arg: str, env: Mapping[str, str]) -> str:
    """The kubelet's $(VAR) expansion of container arguments."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)


def node_settings(objects: list[dict[str, Any]], pool: str, tmp: Path) -> tuple[Any, Any]:
    """The pool's supervisor and agent settings, loaded by the real code from the rendered
    ConfigMap and container arguments (paths moved under `tmp`)."""
    daemonset = find(objects, "DaemonSet", f"ms-modelswap-node-{pool}")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    config = find(objects, "ConfigMap", f"ms-modelswap-node-{pool}")["data"]
    folder = tmp / pool
    folder.mkdir()
    for name, text in config.items():
        (folder / name).write_text(text)
    fields = {"spec.nodeName": "gpu-node-3", "status.podIP": "10.4.0.17",
              "metadata.name": f"ms-modelswap-node-{pool}-x7k2p"}  # fmt: skip
    env = {e["name"]: fields[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in container["env"]}
    args = [
        expand(a, env).replace("/etc/modelswap/config/", f"{folder}/") for a in container["args"]
    ]
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    node_command.register(subparsers)
    node_args = parser.parse_args(["node", *args])
    supervisor = node_command.settings_from_args(node_args)
    sidecar = list(supervisor.agent.command)
    assert sidecar[:2] == ["modelswap", "sidecar"]
    agent_command.register(subparsers)
    agent_args = parser.parse_args(sidecar[1:])
    overrides = {key: getattr(agent_args, attr) for attr, key in agent_command._OVERRIDES.items()}
    return supervisor, load_settings(agent_args.config, overrides)


def test_node_config_loads_with_the_real_settings_code(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    supervisor, agent = node_settings(rendered, "gpu", tmp_path)
    assert (supervisor.agent.user, supervisor.runtime.user) == (
        "modelswap-agent",
        "modelswap-runtime",
    )
    assert supervisor.state_file == agent.triton.supervisor_state_file
    assert supervisor.runtime.triton.model_repository == agent.triton.repository
    assert agent.node_name == "gpu-node-3"
    assert agent.kube is not None and agent.kube.kubeconfig is None  # in-cluster
    assert agent.kube.advertise_host == "10.4.0.17"
    assert agent.kube.heartbeat.holder == "ms-modelswap-node-gpu-x7k2p"
    assert agent.kube.heartbeat.lease_namespace == "modelswap-node-leases"
    assert agent.control_tls == "auto"
    assert agent.gateway_port == 8080 and agent.metrics_port == 9090
    # the gateway's gRPC front, forwarding to Triton's gRPC port
    assert agent.gateway_grpc_port == 8081 and agent.triton.grpc_url == "127.0.0.1:8001"
    assert agent.allocator == "auto" and len(agent.gpus) == 8  # sim fallback: one per GPU
    assert agent.gpu_reserve_bytes == 2 << 30
    assert agent.host_store_capacity_bytes == 16 << 30
    assert agent.cuda.chunk_bytes == 256 << 20
    # One value feeds both: the operator's --grace-seconds and control.graceSeconds.
    operator = operator_container(rendered)["args"]
    assert f"--grace-seconds={agent.grace_seconds:g}" in operator


def test_node_pod_shape(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    _, agent = node_settings(rendered, "gpu", tmp_path)
    pod = find(rendered, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["capabilities"] == {
        "drop": ["ALL"],
        "add": ["SETUID", "SETGID", "KILL", "FOWNER"],
    }
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert find(rendered, "DaemonSet")["spec"]["updateStrategy"] == {"type": "OnDelete"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    # The host store and the socket folder are memory-backed emptyDirs (survive a
    # container restart), under which the agent's own folders are made.
    for name, path in (("host-store", agent.host_store_dir), ("run", agent.socket_path)):
        assert volumes[name]["emptyDir"]["medium"] == "Memory"
        assert Path(path).is_relative_to(mounts[name])
    assert Path(agent.token_file).parent == Path(mounts["token"])
    assert volumes["token"]["secret"]["optional"] is True
    # memory limit = host store (16Gi x 8) + shm 2Gi + 64Mi + overhead 8Gi
    assert container["resources"]["limits"]["memory"] == f"{16 * 1024 * 8 + 2048 + 64 + 8192}Mi"
    assert volumes["host-store"]["emptyDir"]["sizeLimit"] == f"{16 * 1024 * 8}Mi"


def test_two_pools_get_a_daemonset_and_settings_each(tmp_path: Path) -> None:
    objects = render(VALUE_SETS["two-pools"], tmp_path)
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet"} == {
        "ms-modelswap-node-h100", "ms-modelswap-node-gh200"}  # fmt: skip
    _, gh200 = node_settings(objects, "gh200", tmp_path)
    assert gh200.allocator == "cuda-vmm" and gh200.gpus == ()
    assert gh200.host_store_capacity_bytes == 256 << 30
    pod = find(objects, "DaemonSet", "ms-modelswap-node-gh200")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "gh200"}
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_dra_pool_claims_its_gpus_instead_of_the_device_plugin(tmp_path: Path) -> None:
    objects = render(VALUE_SETS["dra"], tmp_path)
    template = find(objects, "ResourceClaimTemplate")
    assert template["apiVersion"] == "resource.k8s.io/v1"
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {"deviceClassName": "gpu.nvidia.com",
                                  "allocationMode": "ExactCount", "count": 4}  # fmt: skip
    pod = find(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [
        {"name": "gpus", "resourceClaimTemplateName": "ms-modelswap-node-gpu"}
    ]
    resources = pod["containers"][0]["resources"]
    assert resources["claims"] == [{"name": "gpus"}]
    assert "nvidia.com/gpu" not in resources["limits"]


def test_rbac_is_what_the_code_calls(rendered: list[dict[str, Any]]) -> None:
    def rules(kind: str, name: str) -> set[tuple[str, str, str]]:
        role = find(rendered, kind, name)
        return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
                for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip

    node = rules("ClusterRole", "ms-modelswap-node")
    assert node == {("", "nodes", "get"), ("modelswap.io", "swapnodes", "get"),
                    ("modelswap.io", "swapnodes", "create"), ("modelswap.io", "swapnodes", "patch"),
                    ("modelswap.io", "swapnodes/status", "patch")}  # fmt: skip
    lease_role = find(rendered, "Role", "ms-modelswap-node")
    assert lease_role["metadata"]["namespace"] == "modelswap-node-leases"
    operator = rules("ClusterRole", "ms-modelswap-operator-models")
    assert not {r for r in operator if r[1] == "secrets" and r[2] != "get"}  # no list/watch
    # Cluster-wide: reads, but for SwapNodes' lease label and a dead node's SwapNode.
    assert {
        r for r in rules("ClusterRole", "ms-modelswap-operator") if r[2] not in ("list", "watch")
    } == {("modelswap.io", "swapnodes", "patch"), ("modelswap.io", "swapnodes", "delete")}


def test_admission_policy_compares_the_name_with_the_token_node(
    rendered: list[dict[str, Any]],
) -> None:
    policy = find(rendered, "ValidatingAdmissionPolicy")
    (condition,) = policy["spec"]["matchConditions"]
    assert "system:serviceaccount:modelswap-system:ms-modelswap-node" in condition["expression"]
    (validation,) = policy["spec"]["validations"]
    assert (
        "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]"
        in (validation["expression"])
    )
    resources = {r for rule in policy["spec"]["matchConstraints"]["resourceRules"]
                 for r in rule["resources"]}  # fmt: skip
    assert resources == {"swapnodes", "swapnodes/status", "leases"}
    binding = find(rendered, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]


def test_control_port_admits_only_the_operator(rendered: list[dict[str, Any]]) -> None:
    policy = find(rendered, "NetworkPolicy", "ms-modelswap-node-control")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 9443, "protocol": "TCP"}]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"


def test_the_gateway_grpc_port_is_a_container_port_and_open_like_the_gateway(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    (container,) = find(rendered, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert {"name": "gateway-grpc", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    (rule,) = find(rendered, "NetworkPolicy", "ms-modelswap-node-gateway")["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}, {"port": 8081, "protocol": "TCP"}]
    # 0 turns the gRPC front off: no port, no rule, and the agent serves none
    off = render({**VALUE_SETS["sim"], "node": {**VALUE_SETS["sim"].get("node", {}),
                                               "ports": {"gatewayGrpc": 0}}}, tmp_path)  # fmt: skip
    (container,) = find(off, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert "gateway-grpc" not in [p["name"] for p in container["ports"]]
    (rule,) = find(off, "NetworkPolicy", "ms-modelswap-node-gateway")["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}]


def test_no_monitoring_namespace_admits_nobody_to_metrics(tmp_path: Path) -> None:
    objects = render(VALUE_SETS["sim"], tmp_path)
    assert find(objects, "NetworkPolicy", "ms-modelswap-node-metrics")["spec"]["ingress"] == []


def test_dashboard_queries_only_documented_metrics() -> None:
    documented = set(
        re.findall(r"`(modelswap_[a-z0-9_]+)`", (ROOT / "docs" / "METRICS.md").read_text())
    )
    histograms = {n for n in documented if n.endswith("_seconds")}
    known = documented | {f"{n}_{s}" for n in histograms for s in ("bucket", "sum", "count")}
    used = dashboard_metrics()
    assert used, "no metric found in the dashboard"
    assert used <= known, f"not in docs/METRICS.md: {sorted(used - known)}"


def test_dashboard_configmap_ships_the_file(tmp_path: Path) -> None:
    objects = render(VALUE_SETS["monitoring"], tmp_path)
    config = find(objects, "ConfigMap", "ms-modelswap-dashboard")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(config["data"]["modelswap.json"])
    assert shipped == json.loads((CHART / "dashboards" / "modelswap.json").read_text())


# -- which Secrets the operator may read (issue 27, item 9) ---------------------------------------


def secret_grants(objects: list[dict[str, Any]]) -> set[tuple[str, str | None, str, str]]:
    """(binding kind, its namespace or None for cluster-wide, role name, verb) of every
    Secret right a binding gives the operator's ServiceAccount."""
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects
             if o["kind"] in ("Role", "ClusterRole")}  # fmt: skip
    found = set()
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s["name"] == "ms-modelswap-operator" for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        for rule in roles[(ref["kind"], ref["name"])]["rules"]:
            if "secrets" in rule["resources"]:
                names = ",".join(rule.get("resourceNames") or ())
                for verb in rule["verbs"]:
                    found.add((binding["kind"], binding["metadata"].get("namespace"),
                               ref["name"] + (f"[{names}]" if names else ""), verb))  # fmt: skip
    return found


#: The operator's own Secret rights in the release namespace: the control token (tokens.py).
TOKEN_RIGHTS = {
    ("RoleBinding", NAMESPACE, "ms-modelswap-operator", "create"),
    ("RoleBinding", NAMESPACE, "ms-modelswap-operator[modelswap-control-token]", "get"),
}


def operator_settings(objects: list[dict[str, Any]], tmp: Path) -> Any:
    container = operator_container(objects)
    args = [a.replace("/etc/modelswap/", f"{tmp}/") for a in container["args"]]
    (tmp / "defaults.yaml").write_text(
        find(objects, "ConfigMap", "ms-modelswap-operator")["data"]["defaults.yaml"]
    )
    parser = argparse.ArgumentParser()
    operator_command.register(parser.add_subparsers())
    return operator_command.settings_from(parser.parse_args(["operator", *args]), {})


def test_cluster_access_reads_secrets_wherever_models_are_served(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    assert secret_grants(rendered) == TOKEN_RIGHTS | {
        ("ClusterRoleBinding", None, "ms-modelswap-operator-models", "get")
    }
    assert operator_settings(rendered, tmp_path).credential_namespaces is None
    watched = render({"operator": {"watchNamespaces": ["team-a", "b"]}}, tmp_path)
    assert secret_grants(watched) == TOKEN_RIGHTS | {
        ("RoleBinding", ns, "ms-modelswap-operator-models", "get") for ns in ("team-a", "b")
    }


def test_opt_in_grants_secret_reads_only_in_the_listed_namespaces(tmp_path: Path) -> None:
    objects = render(VALUE_SETS["credentials-opt-in"], tmp_path)
    # No cluster-wide Secret read: one RoleBinding of the get-only role per listed namespace.
    assert secret_grants(objects) == TOKEN_RIGHTS | {
        ("RoleBinding", ns, "ms-modelswap-operator-credentials", "get")
        for ns in ("team-a", "team-c")
    }
    models = find(objects, "ClusterRole", "ms-modelswap-operator-models")
    assert not [r for r in models["rules"] if "secrets" in r["resources"]]
    # The operator is told the same list, so it asks nowhere else.
    assert operator_settings(objects, tmp_path).credential_namespaces == ("team-a", "team-c")
    # Opted in with no namespace listed: no Secret right but the token's, nothing read.
    empty = render({"operator": {"credentials": {"access": "optIn", "namespaces": []}}}, tmp_path)
    assert secret_grants(empty) == TOKEN_RIGHTS
    assert operator_settings(empty, tmp_path).credential_namespaces == ()
    # With watchNamespaces too: the watched namespaces' rights carry no Secret read.
    both = render({"operator": {"watchNamespaces": ["team-a", "b"],
                                "credentials": {"access": "optIn", "namespaces": ["team-a"]}}},
                  tmp_path)  # fmt: skip
    assert secret_grants(both) == TOKEN_RIGHTS | {
        ("RoleBinding", "team-a", "ms-modelswap-operator-credentials", "get")
    }
    assert operator_settings(both, tmp_path).credential_namespaces == ("team-a",)


@pytest.mark.parametrize(
    ("operator", "message"),
    [
        ({"watchNamespaces": ["team-a"], "credentials": {"access": "optIn",
                                                          "namespaces": ["team-b"]}},
         '"team-b" is not in operator.watchNamespaces'),
        ({"credentials": {"access": "cluster", "namespaces": ["team-a"]}},
         "operator.credentials.namespaces is read only with operator.credentials.access: optIn"),
    ],
)  # fmt: skip
def test_credentials_namespaces_that_would_mean_nothing_are_refused(
    operator: dict[str, Any], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"operator": operator}))
    done = helm("helm4", "template", "ms", str(CHART), "-n", NAMESPACE, "-f", str(path))
    assert done.returncode != 0 and message in done.stderr, done.stderr
