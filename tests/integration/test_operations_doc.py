"""docs/operations.md's commands, taken from its code blocks (a changed doc changes what
runs here), and the claims their comments make:

- every `helm install`/`helm upgrade` renders (`helm template`) and passes `helm lint
  --strict` (the chart's values schema) with helm v3 and v4, with the doc's flags and the
  doc's example values file in place of `my-values.yaml`;
- the `docker build` commands name Dockerfiles that exist and tag pyproject's version
  (no container engine here: nothing is built);
- the install block runs against the authorizing API emulator: `helm install` with the
  doc's flags (the example values) and the `kubectl` commands after it;
- the status-reading commands, and the node drain (`kubectl cordon` ... `uncordon`), run
  with the real kubectl against the API emulator with two real agents and the operator:
  a cordoned node's taint reaches its SwapNode and the model moves (`TaintNotTolerated`);
- every name the doc gives in backticks exists: values keys, settings keys and object
  fields (in values.schema.json, the rendered chart and its settings files, the CRDs, the
  Dockerfiles' labels), metric names (in METRICS.md; test_chart_install.py finds them in a
  real scrape), condition types and reasons (written by the code), and the defaults the
  drain's comment quotes (read by the agent's settings code).

Not run: the drain's `kubectl ... --field-selector spec.nodeName=...` pod commands (the
emulator serves no field selector on Pods but metadata.name/namespace, and runs no pods);
their namespace and label selector are checked against the rendered chart instead.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client

from modelswap_sidecar.agent.settings.document import load_settings
from modelswap_sidecar.supervisor.restarts import RestartPolicy
from tests.support.agent_harness import Node, node
from tests.support.chart_world import helm_env
from tests.support.dashboard import named_metrics
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import REPO_ROOT, Kubectl, load_yaml
from tests.support.operator_world import Objects, agent_config, emulator, operator
from tests.support.waiting import until

DOC = REPO_ROOT / "docs" / "operations.md"
README = REPO_ROOT / "README.md"
CHART = REPO_ROOT / "charts" / "modelswap"
BIN = Path(sys.executable).parent
HELMS = {"helm4": BIN / "helm", "helm3": BIN / "helm3"}
MODEL = REPO_ROOT / "examples" / "toy" / "classify-drop-on-idle.yaml"
#: What the node controller adds to a cordoned Node (TaintNodesByCondition).
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
T = TypeVar("T")


# -- the doc's code blocks ------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    #: The pipeline's commands, each split as the shell would.
    pipeline: tuple[tuple[str, ...], ...]
    #: The comment on its line and on the comment lines right after it.
    comment: str

    @property
    def argv(self) -> tuple[str, ...]:
        return self.pipeline[0]

    def substituted(self, mapping: dict[str, str]) -> Command:
        def sub(word: str) -> str:
            for old, new in mapping.items():
                word = word.replace(old, new)
            return word

        pipeline = tuple(tuple(sub(w) for w in argv) for argv in self.pipeline)
        return Command(pipeline, self.comment)


def doc_text() -> str:
    return DOC.read_text()


def readme_cluster_section() -> str:
    """README's "On a cluster" section."""
    section = re.search(r"^## On a cluster\n(.*?)(?=^## )", README.read_text(),
                        flags=re.MULTILINE | re.DOTALL)  # fmt: skip
    assert section, "README has no cluster section"
    return section.group(1)


def code_blocks(language: str | None = None, text: str | None = None) -> list[str]:
    text = doc_text() if text is None else text
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    return [body for lang, body in blocks if language is None or lang == language]


def commands(block: str) -> list[Command]:
    """The block's shell commands: continuation lines joined, comments kept per command."""
    found: list[Command] = []
    logical = re.sub(r"\\\n\s*", " ", block)
    for line in logical.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if found:  # a comment line explains the command above it
                last = found[-1]
                found[-1] = Command(last.pipeline, f"{last.comment} {stripped[1:].strip()}")
            continue
        parts = re.split(r"\s+#\s?", stripped, maxsplit=1)
        code, comment = parts[0], (parts[1] if len(parts) > 1 else "")
        pipeline = tuple(tuple(shlex.split(part)) for part in code.split(" | "))
        found.append(Command(pipeline, comment.strip()))
    return found


def all_commands() -> list[Command]:
    return [c for block in code_blocks() for c in commands(block)]


def doc_commands(*prefix: str) -> list[Command]:
    return [c for c in all_commands() if c.argv[: len(prefix)] == prefix]


def block_with(*argv: str) -> list[Command]:
    """The commands of the code block holding a command that starts with `argv` (whole words;
    a command that is exactly `argv` wins)."""
    blocks = [commands(block) for block in code_blocks()]
    for exact in (True, False):
        for found in blocks:
            if any(c.argv == argv if exact else c.argv[: len(argv)] == argv for c in found):
                return found
    raise AssertionError(f"no code block in {DOC.name} runs {' '.join(argv)}")


def example_values() -> dict[str, Any]:
    """The doc's example values file (its one YAML block)."""
    (values,) = code_blocks("yaml")
    loaded: dict[str, Any] = yaml.safe_load(values)
    return loaded


def option(argv: tuple[str, ...], *names: str) -> str | None:
    for i, word in enumerate(argv):
        for name in names:
            if word == name and i + 1 < len(argv):
                return argv[i + 1]
            if word.startswith(f"{name}="):
                return word.split("=", 1)[1]
    return None


# -- helm install / upgrade -----------------------------------------------------------------


def helm_args(command: Command, values_file: Path) -> tuple[list[str], str]:
    """The command's arguments after `install`/`upgrade`, with the doc's values file (not
    in the repository, e.g. `my-values.yaml`) replaced by the example; and its namespace."""
    args = list(command.argv[2:])
    for i, word in enumerate(args):
        if args[i - 1] in ("-f", "--values") and not (REPO_ROOT / word).exists():
            args[i] = str(values_file)
    namespace = option(command.argv, "-n", "--namespace") or "default"
    return args, namespace


def run_helm(which: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HELMS[which]), *args], capture_output=True, text=True,
                          timeout=120, check=False, cwd=REPO_ROOT)  # fmt: skip


def helm_commands() -> list[Command]:
    found = doc_commands("helm", "install") + doc_commands("helm", "upgrade")
    assert found, f"{DOC.name} shows no helm install"
    return found


@pytest.mark.parametrize("which", sorted(HELMS))
def test_helm_commands_render_and_lint(which: str, tmp_path: Path) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(example_values()))
    for command in helm_commands():
        args, namespace = helm_args(command, values_file)
        rendered = run_helm(which, "template", *args)
        assert rendered.returncode == 0, f"{command.argv}: {rendered.stderr}"
        objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
        # `helm lint` takes the chart, not a release name, and no --create-namespace.
        positional = [a for a in args if not a.startswith("-")]
        lint_args = [a for a in args if a not in (positional[0], "--create-namespace")]
        linted = run_helm(which, "lint", "--strict", *lint_args)
        assert linted.returncode == 0, f"{command.argv}: {linted.stdout}{linted.stderr}"
        assert "0 chart(s) failed" in linted.stdout

        # The example's pools are node DaemonSets, pulling from the doc's registry.
        registry = option(command.argv, "--set")
        daemonsets = [o for o in objects if o["kind"] == "DaemonSet"]
        pools = [p["name"] for p in example_values()["nodePools"]]
        assert len(daemonsets) == len(pools)
        for daemonset in daemonsets:
            assert daemonset["metadata"]["namespace"] == namespace
            image = daemonset["spec"]["template"]["spec"]["containers"][0]["image"]
            if registry and registry.startswith("image.registry="):
                assert image.startswith(registry.split("=", 1)[1] + "/"), image
        check_drain_commands_match(daemonsets, namespace)


def check_drain_commands_match(daemonsets: list[dict[str, Any]], namespace: str) -> None:
    """The drain's pod commands look where the chart puts node pods, with their labels."""
    pod_commands = [c for c in all_commands() if c.argv[:1] == ("kubectl",) and "pod" in
                    " ".join(c.argv) and option(c.argv, "-n", "--namespace")]  # fmt: skip
    assert pod_commands
    for command in pod_commands:
        assert option(command.argv, "-n", "--namespace") == namespace, command.argv
        selector = option(command.argv, "-l", "--selector")
        if selector:
            for term in selector.split(","):
                key, _, value = term.partition("=")
                for daemonset in daemonsets:
                    labels = daemonset["spec"]["template"]["metadata"]["labels"]
                    assert labels.get(key) == value, (command.argv, labels)


@pytest.mark.parametrize("which", sorted(HELMS))
def test_a_wrong_value_is_refused_as_the_doc_quotes(which: str, tmp_path: Path) -> None:
    text = " ".join(doc_text().split())
    sentence = re.search(r"refuses a wrong value naming it, e\.g\. (.*?)\):", text)
    assert sentence, "the doc no longer quotes the schema's refusal"
    quotes = dict(re.findall(r"Helm (\d): `([^`]+)`", sentence.group(1)))
    assert set(quotes) == {"3", "4"}, sentence.group(1)
    pointer = re.search(r"at '(/[^']+)'", quotes["4"])
    assert pointer
    key = pointer.group(1).strip("/").replace("/", ".")
    done = run_helm(which, "template", "ms", str(CHART), "--set", f"{key}=wrong")
    assert done.returncode != 0
    assert quotes[which[-1]] in done.stderr, done.stderr


@pytest.mark.parametrize("which", sorted(HELMS))
def test_readme_cluster_section_installs_with_helm(which: str) -> None:
    """README's cluster section says what a cluster needs and installs with `helm install`,
    which renders and lints as given; its node pods go only to the GPU nodes the comment
    names and tolerate their taint."""
    section = readme_cluster_section()
    for need in ("Kubernetes 1.30", "NVIDIA device plugin", "images", "Helm 3 or 4"):
        assert need in " ".join(section.split()), need
    installs = [c for block in code_blocks("sh", section) for c in commands(block)
                if c.argv[:2] == ("helm", "install")]  # fmt: skip
    assert installs
    for command in installs:
        args = list(command.argv[2:])
        rendered = run_helm(which, "template", *args)
        assert rendered.returncode == 0, rendered.stderr
        positional = [a for a in args if not a.startswith("-")]
        lint_args = [a for a in args if a not in (positional[0], "--create-namespace")]
        linted = run_helm(which, "lint", "--strict", *lint_args)
        assert linted.returncode == 0, linted.stdout + linted.stderr
        selector = re.search(r"nodes labelled (\S+)=(\S+);", command.comment)
        assert selector, command.comment
        for obj in (o for o in yaml.safe_load_all(rendered.stdout) if o):
            if obj["kind"] == "DaemonSet":
                pod = obj["spec"]["template"]["spec"]
                assert pod["nodeSelector"] == {selector.group(1): selector.group(2)}, pod
                assert pod["tolerations"], "the GPU nodes' taint is not tolerated"


# -- docker build ---------------------------------------------------------------------------


def test_docker_build_commands_name_real_dockerfiles_and_the_version() -> None:
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    builds = doc_commands("docker", "build")
    assert builds
    table = dict(re.findall(r"^\| `([\w-]+)` \| `(images/[\w.]+)` \|", doc_text(), re.MULTILINE))
    assert table, "the images table is gone"
    for command in builds:
        dockerfile = option(command.argv, "-f", "--file")
        tag = option(command.argv, "-t", "--tag")
        assert dockerfile and tag, command.argv
        path = REPO_ROOT / dockerfile
        assert path.is_file(), dockerfile
        name, _, tag_version = tag.partition(":")
        assert tag_version == version, f"{tag}: pyproject.toml says {version}"
        assert table.get(name) == dockerfile, f"{name} is built from {table.get(name)}"
        assert command.argv[-1] == ".", "built from the repository root"
        declared = re.findall(r"^ARG (\w+)", path.read_text(), re.MULTILINE)
        for i, word in enumerate(command.argv):
            if word == "--build-arg":
                assert command.argv[i + 1].split("=")[0] in declared, command.argv[i + 1]


# -- status and the node drain, against the emulator ----------------------------------------


@contextlib.asynccontextmanager
async def two_agents(api: Any, tmp_path: Path) -> AsyncIterator[dict[str, Node]]:
    """Real agents on node-a and node-b. The chart reads the Node again every 60 s
    (`kube.nodeRefreshSeconds`'s default); here every half second, to keep the test short."""
    async with contextlib.AsyncExitStack() as stack:
        started = {}
        for name in ("node-a", "node-b"):
            config = agent_config(api, name)
            config.extra["kube"]["nodeRefreshSeconds"] = 0.5
            workdir = tmp_path / name
            workdir.mkdir()
            started[name] = await stack.enter_async_context(node(workdir, config))
        yield started


def run(kubectl: Kubectl, command: Command) -> subprocess.CompletedProcess[str]:
    """The command with the real kubectl; a pipeline's later stages as real processes."""
    assert command.argv[0] == "kubectl", command.argv
    done = kubectl.run(*command.argv[1:])
    for stage in command.pipeline[1:]:
        if done.returncode != 0:
            break
        done = subprocess.run(list(stage), input=done.stdout, capture_output=True, text=True,
                              timeout=30, check=False)  # fmt: skip
    return done


def ready_node(objects: Objects, name: str) -> str | None:
    obj = objects.get(name) or {}
    status = obj.get("status") or {}
    if objects.condition(name, "Ready").get("status") == "True":
        node_name: str | None = status.get("node")
        return node_name
    return None


def swapnode_taints(kubectl: Kubectl, node_name: str) -> list[dict[str, Any]]:
    done = kubectl.run("get", "swapnode", node_name, "-o", "json", check=True)
    taints: list[dict[str, Any]] = json.loads(done.stdout).get("status", {}).get("nodeTaints") or []
    return taints


def node_taints(kubectl: Kubectl, node_name: str) -> list[dict[str, Any]]:
    done = kubectl.run("get", "node", node_name, "-o", "json", check=True)
    taints: list[dict[str, Any]] = json.loads(done.stdout)["spec"].get("taints") or []
    return taints


def check_status_command(kubectl: Kubectl, objects: Objects, command: Command, name: str) -> None:
    done = run(kubectl, command)
    assert done.returncode == 0, f"{command.argv}: {done.stderr}"
    out, argv = done.stdout, command.argv
    if argv[1:3] == ("get", "md") and "-o" not in argv:
        header = out.splitlines()[0].split()
        assert "NAMESPACE" in header, out  # -A
        # "model, node, phase, ready, resident bytes, last request": the columns.
        for item in command.comment.split(","):
            words = item.strip().upper().split()
            assert "-".join(words) in header or words[0] in header, (item, header)
        assert name in out and "True" in out, out
    elif argv[1] == "describe":
        conditions = re.search(r"\(([^)]*)\)", command.comment)
        assert conditions, command.comment
        for kind in conditions.group(1).split(","):
            assert re.search(rf"Type:\s+{kind.strip()}\b", out), (kind, out)
        if "Events" in command.comment:
            assert re.search(r"^Events:", out, re.MULTILINE), out
    elif "jsonpath" in " ".join(argv):
        shown = json.loads(out)
        assert shown == (objects.get(name) or {})["status"]["effectivePolicy"]
        assert shown["priority"] == load_yaml(MODEL)["spec"]["swapPolicy"]["priority"]
    elif argv[1:3] == ("get", "swapnodes") and "-o" not in argv:
        # "LEASE: Live, or Expired": both nodes' Leases are renewed
        header, *rows = out.splitlines()
        column = header.split().index("LEASE")
        assert {row.split()[0]: row.split()[column] for row in rows} == {
            "node-a": "Live", "node-b": "Live"}, out  # fmt: skip
        # "GPUS, HBM-FREE, MODELS": each node's two sim GPUs, free HBM as a quantity
        named = header.split()
        for row in rows:
            cells = dict(zip(named, row.split(), strict=False))
            assert cells["GPUS"] == "2" and cells["HBM-FREE"].endswith("Mi"), out
            assert cells["MODELS"].isdigit(), out
    elif argv[1:3] == ("get", "swapnodes"):
        items = yaml.safe_load(out)["items"]
        assert {i["metadata"]["name"] for i in items} == {"node-a", "node-b"}
        for item in items:
            gpus = item["status"]["gpus"]
            assert gpus
            for gpu in gpus:  # "per GPU: HBM total/reserved/free, host store, link"
                for key in ("hbmTotalBytes", "hbmReservedBytes", "hbmFreeBytes",
                            "hostStoreBytes", "hostStoreCapacityBytes", "link"):  # fmt: skip
                    assert key in gpu, (key, gpu)
    elif "leases" in argv:
        assert {"node-a", "node-b"} <= set(lease_rows(out)), out
        if "RENEWED" in command.comment:
            assert "RENEWED" in out.splitlines()[0].split(), out
    else:
        raise AssertionError(f"no check for {argv}")


def lease_rows(table: str) -> dict[str, str]:
    """The table's rows by their first column (the Lease's name)."""
    return {line.split()[0]: line for line in table.splitlines()[1:] if line.strip()}


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_status_and_drain_commands(tmp_path: Path) -> None:
    status_commands = block_with("kubectl", "get", "md", "-A")
    drain = block_with("kubectl", "cordon")
    assert len(status_commands) >= 5 and drain
    name = load_yaml(MODEL)["metadata"]["name"]
    with emulator() as api:
        objects = Objects(api)
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        try:
            async with two_agents(api, tmp_path):
                with operator(api):
                    kubectl.run("apply", "-f", str(MODEL), check=True)
                    first_node = await until(lambda: ready_node(objects, name), f"{name} Ready")

                    for command in status_commands:
                        check_status_command(kubectl, objects, command.substituted(
                            {"<name>": name}), name)  # fmt: skip
                    # The heartbeat: the doc's own command shows node-a's row change.
                    leases = next(c for c in status_commands if "leases" in c.argv)
                    before = lease_rows(run(kubectl, leases).stdout)["node-a"]
                    await until(lambda: lease_rows(run(kubectl, leases).stdout).get("node-a")
                                not in (None, before), "node-a's Lease renewed")  # fmt: skip

                    await drain_node(kubectl, objects, drain, name, first_node)
        finally:
            objects.close()


async def drain_node(
    kubectl: Kubectl, objects: Objects, drain: list[Command], name: str, node_name: str
) -> None:
    placeholder = next(c for c in drain if c.argv[:2] == ("kubectl", "cordon")).argv[2]
    for command in (c.substituted({placeholder: node_name}) for c in drain):
        argv = command.argv
        if argv[1] == "cordon":
            done = run(kubectl, command)
            assert done.returncode == 0, done.stderr
            assert "node.kubernetes.io/unschedulable" in command.comment
            if not any(t["key"] == UNSCHEDULABLE_TAINT["key"] for t in node_taints(kubectl,
                                                                                  node_name)):  # fmt: skip
                # The emulator sets spec.unschedulable only; a cluster's node controller
                # then adds the taint. Do what it does.
                taints = [*node_taints(kubectl, node_name), UNSCHEDULABLE_TAINT]
                patch = json.dumps({"spec": {"taints": taints}})
                kubectl.run("patch", "node", node_name, "-p", patch, check=True)
            await until(lambda: any(t["key"] == UNSCHEDULABLE_TAINT["key"]
                                    for t in swapnode_taints(kubectl, node_name)),
                        f"the taint in SwapNode {node_name}", 30)  # fmt: skip
        elif argv[1:3] == ("get", "md"):
            # "wait until nothing is left there": grep finds no line (exit 1).
            await until(lambda c=command: run(kubectl, c).returncode == 1,
                        f"no model left on {node_name}")  # fmt: skip
            moved = await until(lambda: ready_node(objects, name), f"{name} Ready again")
            assert moved != node_name
            placed = objects.condition(name, "Placed")
            reasons = {placed.get("reason")} | {r for r, _ in objects.events(name)}
            assert "TaintNotTolerated" in reasons, (placed, objects.events(name))
            assert "TaintNotTolerated" in command.comment + " ".join(c.comment for c in drain)
        elif "--field-selector" in argv:
            continue  # pods: not served by the emulator (see the module's docstring)
        elif argv[1] == "uncordon":
            done = run(kubectl, command)
            assert done.returncode == 0, done.stderr
            spec = json.loads(kubectl.run("get", "node", node_name, "-o", "json").stdout)["spec"]
            assert not spec.get("unschedulable")
            # The node controller removes its taint again; so does this test.
            kept = [t for t in node_taints(kubectl, node_name)
                    if t["key"] != UNSCHEDULABLE_TAINT["key"]]  # fmt: skip
            kubectl.run("patch", "node", node_name, "-p",
                        json.dumps({"spec": {"taints": kept or None}}), check=True)  # fmt: skip
            await until(lambda: not swapnode_taints(kubectl, node_name),
                        f"SwapNode {node_name} without the taint", 30)  # fmt: skip
        else:
            raise AssertionError(f"no step for {argv}")


# -- the install block, against the emulator ------------------------------------------------


#: The Prometheus Operator's ServiceMonitor CRD, reduced to what serving the kind needs.
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "ServiceMonitor", "plural": "servicemonitors",
                       "singular": "servicemonitor", "listKind": "ServiceMonitorList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                 "openAPIV3Schema": {"type": "object",
                                     "x-kubernetes-preserve-unknown-fields": True}}}]},
}  # fmt: skip


@pytest.mark.slow
def test_install_block_runs_against_the_emulator(tmp_path: Path) -> None:
    """The block's `helm install` (the example values for `my-values.yaml`) as the cluster
    admin, then its `kubectl` commands: no pods run here and no agent, so `get swapnodes`
    lists none, but each command works against what the chart made."""
    block = block_with("helm", "install")
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(example_values()))
    with EmulatorThread(tls=True) as api:
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        if example_values().get("serviceMonitor", {}).get("enabled"):
            # "Needs": the Prometheus Operator's CRDs, for `serviceMonitor.enabled`.
            assert "serviceMonitor.enabled` needs the Prometheus Operator" in doc_text()
            api.create(SERVICE_MONITOR_CRD)
        for command in block:
            if command.argv[0] == "helm":
                args, namespace = helm_args(command, values_file)
                done = subprocess.run([str(HELMS["helm4"]), command.argv[1], *args],
                                      env=helm_env(api), capture_output=True, text=True,
                                      timeout=120, check=False, cwd=REPO_ROOT)  # fmt: skip
                assert done.returncode == 0, f"{command.argv}: {done.stderr}"
                assert "STATUS: deployed" in done.stdout, done.stdout
            else:
                done = run(kubectl, command)
                assert done.returncode == 0, f"{command.argv}: {done.stderr}"
                assert "No resources found" in done.stdout + done.stderr, done.stdout
        # What would run the pods `get pods` lists is there.
        made = kubectl.run("-n", namespace, "get", "daemonsets,deployments", "-o", "name")
        assert made.returncode == 0 and "daemonset.apps/" in made.stdout, made.stderr
        assert "deployment.apps/" in made.stdout, made.stdout


# -- the names the doc gives ------------------------------------------------------------------

#: Kubernetes' and Docker's own words the doc uses, not reasons modelswap writes.
OTHER_WORDS = {"CrashLoopBackOff", "RuntimeDefault", "OnDelete", "RollingUpdate", "BuildKit"}
#: A key (dotted, `[n]` or `[]` for list items) at the start of a backticked name, alone
#: or followed by `: value`, `=value` or more words.
KEY = re.compile(r"^([a-z][A-Za-z0-9]*(?:\[\d*\])?(?:\.[a-z][A-Za-z0-9]*(?:\[\d*\])?)*)(?=$|:|=| )")


def backticked() -> list[str]:
    return re.findall(r"`([^`\n]+)`", doc_text())


@functools.cache
def python_source() -> str:
    files = [f for d in ("api", "operator", "sidecar") for f in (REPO_ROOT / d).rglob("*.py")]
    return "\n".join(f.read_text() for f in files)


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a YAML document (`a.b`, `a[].b` through lists)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            found |= {path} | key_paths(item, path)
    elif isinstance(value, list):
        found.add(f"{prefix}[]")
        for item in value:
            found |= key_paths(item, f"{prefix}[]")
    return found


def schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Every property path of a JSON schema (values.schema.json, a CRD's openAPIV3Schema)."""
    found: set[str] = set()
    for key, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}.{key}" if prefix else key
        found |= {path} | schema_paths(sub, path)
    if isinstance(schema.get("items"), dict):
        found |= {f"{prefix}[]"} | schema_paths(schema["items"], f"{prefix}[]")
    return found


@functools.cache
def known_names() -> tuple[frozenset[str], frozenset[str]]:
    """(key paths, file names) the doc may name."""
    paths = schema_paths(json.loads((CHART / "values.schema.json").read_text()))
    for crd in (REPO_ROOT / "crds").glob("*.yaml"):
        for version in load_yaml(crd)["spec"]["versions"]:
            paths |= schema_paths(version["schema"]["openAPIV3Schema"])
    rendered = run_helm("helm4", "template", "ms", str(CHART))
    assert rendered.returncode == 0, rendered.stderr
    files = {p.name for p in REPO_ROOT.glob("*")} | {p.name for p in CHART.rglob("*")}
    for obj in (o for o in yaml.safe_load_all(rendered.stdout) if o):
        paths |= key_paths(obj)
        for name, text in (obj.get("data") or {}).items() if obj["kind"] == "ConfigMap" else ():
            files.add(name)
            loaded = yaml.safe_load(text)
            paths |= key_paths(loaded) if isinstance(loaded, dict) else set()
    paths |= key_paths(yaml.safe_load((CHART / "Chart.yaml").read_text()))
    # The Lease fields the heartbeat command shows, as the Kubernetes API names them.
    paths |= {f"spec.{field}" for field in client.V1LeaseSpec.attribute_map.values()}
    for dockerfile in (REPO_ROOT / "images").glob("*.Dockerfile"):
        paths |= set(re.findall(r"\b(org\.opencontainers\.[\w.]+)=", dockerfile.read_text()))
    return frozenset(paths), frozenset(files)


def names_a_known_key(key: str, paths: frozenset[str]) -> bool:
    key = re.sub(r"\[\d+\]", "[]", key)
    return any(p == key or p.endswith("." + key) for p in paths)


def test_named_keys_and_fields_exist() -> None:
    paths, files = known_names()
    checked, unknown = [], []
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    for token in backticked():
        match = KEY.match(token)
        if not match:
            continue
        key = match.group(1)
        keyed = token[len(key) :].startswith(": ")
        if not ("." in key or "[" in key or keyed or re.search(r"[A-Z]", key)):
            continue  # a plain word: a command, a backend name, ...
        checked.append(key)
        if key in files or names_a_known_key(key, paths):
            continue
        if f'"{key.replace(".", "-")}' in pyproject:  # a Python module of a dependency
            continue
        unknown.append(token)
    assert {"crds.enabled", "kube.inCluster", "status.effectivePolicy"} <= set(checked)
    assert not unknown, f"{DOC.name} names what nothing defines: {unknown}"


def test_named_metrics_are_documented() -> None:
    listed = set(re.findall(r"modelswap_[a-z0-9_]+", (DOC.parent / "METRICS.md").read_text()))
    patterns = named_metrics(doc_text())
    assert patterns
    unmatched = [p for p in patterns if not any(re.fullmatch(p, n) for n in listed)]
    assert not unmatched, f"not in METRICS.md: {unmatched}"


def test_named_reasons_and_conditions_are_written_by_the_code() -> None:
    text = doc_text()
    words: set[str] = set()
    for token in backticked():
        words |= set(re.findall(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)+\b", token))
    words |= set(re.findall(r"\(([A-Z][a-z]+(?:[A-Z][a-z]+)+)\)", text))
    words -= OTHER_WORDS
    assert {"NodeLost", "TaintNotTolerated", "QueueFull", "AgentUnavailable"} <= words
    source = python_source()
    missing = sorted(w for w in words if f'"{w}"' not in source)
    assert not missing, f"reasons no code writes: {missing}"
    conditions = re.findall(r"`(\w+)=(?:True|False)", text)
    conditions += re.findall(r"conditions \(([^)]*)\)", text)[0].split(", ")
    assert conditions
    for condition in conditions:
        assert f'type="{condition}"' in source, condition


def test_quoted_defaults_are_the_agents(tmp_path: Path) -> None:
    """The drain's comment quotes settings with their defaults (`name, 60`): the agent's
    settings code reads the chart's agent.yaml to those values."""
    quoted = []
    for command in block_with("kubectl", "cordon"):
        quoted += re.findall(r"([a-z][\w.]*[A-Z]\w*), (\d+)\b", command.comment)
    assert len(quoted) >= 2, quoted
    rendered = run_helm("helm4", "template", "ms", str(CHART), "--show-only",
                        "templates/node-configmap.yaml")  # fmt: skip
    agent_yaml = yaml.safe_load(yaml.safe_load(rendered.stdout)["data"]["agent.yaml"])
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(agent_yaml))
    settings = load_settings(path, {"nodeName": "gpu-node-3"})
    heartbeat = settings.kube.heartbeat if settings.kube else None
    for name, value in quoted:
        leaf = name.split(".")[-1]
        snake = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), leaf)
        assert leaf not in agent_yaml.get("kube", {}), f"{name} is set by the chart"
        assert getattr(heartbeat, snake) == float(value), (name, value)


# -- troubleshooting: settings errors ---------------------------------------------------------


def set_path(doc: Any, path: str, value: Any) -> None:
    """Set `a.b[0].c` in a loaded YAML document."""
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    for part in parts[:-1]:
        doc = doc[int(part[1:-1])] if part.startswith("[") else doc[part]
    last = parts[-1]
    doc[int(last[1:-1]) if last.startswith("[") else last] = value


def test_settings_errors_exit_as_the_troubleshooting_table_says(tmp_path: Path) -> None:
    """Each quoted log line (`modelswap node: <key>: …`, `modelswap sidecar: <key>: …`):
    the chart's own settings file with a wrong value at that key makes that program exit 2
    with that line; and the supervisor gives up after the restarts the table quotes."""
    text = " ".join(doc_text().split())
    quotes = re.findall(r"`modelswap (node|sidecar): ([\w.\[\]]+): …`", text)
    assert {program for program, _ in quotes} == {"node", "sidecar"}, quotes
    rendered = run_helm("helm4", "template", "ms", str(CHART), "--show-only",
                        "templates/node-configmap.yaml")  # fmt: skip
    data = yaml.safe_load(rendered.stdout)["data"]
    for program, key in quotes:
        doc = yaml.safe_load(data["node.yaml" if program == "node" else "agent.yaml"])
        set_path(doc, key, 0 if key.endswith("Port") else "lots")
        path = tmp_path / f"{program}.yaml"
        path.write_text(yaml.safe_dump(doc))
        done = subprocess.run([str(BIN / "modelswap"), program, f"--config={path}",
                               *(["--node-name=gpu-node-3"] if program == "sidecar" else [])],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 2, (program, key, done.stderr)
        assert done.stderr.startswith(f"modelswap {program}: {key}: "), done.stderr
    gives_up = re.search(r"gives up \(exit 1\) after (\d+) restarts in (\d+) s", text)
    assert gives_up, "the table no longer says when the supervisor gives up"
    policy = RestartPolicy()
    assert (policy.give_up_after_restarts, policy.give_up_window_seconds) == (
        int(gives_up.group(1)), float(gives_up.group(2)))  # fmt: skip
    assert "restart" not in yaml.safe_load(data["node.yaml"]), "the chart keeps the defaults"
