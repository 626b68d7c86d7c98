"""The real kubectl (1.35) against the emulator: what users type in the README works as
against a cluster, including client-side apply with server-side field validation."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import KUBECTL, REPO_ROOT, Kubectl, api_client
from tests.support.waiting import wait_for

INVALID = sorted((REPO_ROOT / "tests" / "data" / "invalid").glob("*.yaml"))
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))
CLASSIFY = REPO_ROOT / "examples" / "toy" / "classify-drop-on-idle.yaml"
CLASSIFY_POLICY = yaml.safe_load(CLASSIFY.read_text())["spec"]["swapPolicy"]


@pytest.fixture
def api() -> Iterator[EmulatorThread]:
    with EmulatorThread() as api:
        yield api


@pytest.fixture
def kubectl(api: EmulatorThread) -> Kubectl:
    kubectl = Kubectl(api.kubeconfig_path, api.home)
    kubectl.run("apply", "-f", "crds/", check=True)
    kubectl.run("api-resources", check=True)  # refresh the discovery cache, as users do
    return kubectl


@pytest.fixture(scope="module")
def shared_kubectl() -> Iterator[Kubectl]:
    with EmulatorThread() as api:
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        kubectl.run("apply", "-f", "crds/", check=True)
        yield kubectl


def md_names(kubectl: Kubectl) -> list[str]:
    out = kubectl.run("get", "md", "-o", "name", check=True).stdout
    return sorted(line.split("/", 1)[1] for line in out.split())


def test_apply_crds_then_examples_then_get_and_delete(api: EmulatorThread) -> None:
    kubectl = Kubectl(api.kubeconfig_path, api.home)
    applied = kubectl.run("apply", "-f", "crds/", check=True).stdout
    assert (
        "customresourcedefinition.apiextensions.k8s.io/modeldeployments.modelswap.io created"
        in applied
    )
    kubectl.run("wait", "--for=condition=Established", "crd/modeldeployments.modelswap.io",
                "--timeout=10s", check=True)  # fmt: skip
    created = kubectl.run("apply", "-f", "examples/", check=True).stdout
    assert created.count(" created") == len(EXAMPLES)
    again = kubectl.run("apply", "-f", "examples/", check=True).stdout
    assert again.count(" unchanged") == len(EXAMPLES)
    assert len(md_names(kubectl)) == len(EXAMPLES)
    assert kubectl.run("delete", "-f", "examples/", check=True).stdout.count(" deleted") == len(
        EXAMPLES
    )
    assert md_names(kubectl) == []


def test_get_md_prints_the_printer_columns(api: EmulatorThread, kubectl: Kubectl) -> None:
    kubectl.run("apply", "-f", str(CLASSIFY), check=True)
    with api_client(api.kubeconfig_path) as kube:
        client.CustomObjectsApi(kube).patch_namespaced_custom_object_status(
            "modelswap.io", "v1alpha1", "default", "modeldeployments", "classify",
            {"status": {"phase": "Resident", "node": "gpu-1", "residentBytes": 33554432,
                        "modelName": "classify", "residentSize": "32Mi",
                        "conditions": [{"type": "Ready", "status": "True", "reason": "Serving",
                                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
        )  # fmt: skip
    lines = kubectl.run("get", "md", check=True).stdout.splitlines()
    header = ["NAME", "MODEL", "NODE", "PHASE", "READY", "REASON", "RESIDENT", "LAST-REQUEST",
              "AGE"]  # fmt: skip
    assert lines[0].split() == header
    cells = lines[1].split()
    assert cells[:7] == ["classify", "classify", "gpu-1", "Resident", "True", "Serving", "32Mi"]
    assert re.fullmatch(r"\d+s", cells[-1])
    by_short_name = kubectl.run("get", "modeldeployments.modelswap.io", "classify", check=True)
    assert by_short_name.stdout.splitlines()[1].split()[0] == "classify"


def test_unknown_field_is_refused_not_pruned(kubectl: Kubectl) -> None:
    manifest = CLASSIFY.read_text().replace(
        "  swapPolicy:\n", "  swapPolicy:\n    idleAftr: 5m\n", 1
    )
    refused = kubectl.run("apply", "-f", "-", input_text=manifest)
    assert refused.returncode != 0
    assert 'strict decoding error: unknown field "spec.swapPolicy.idleAftr"' in refused.stderr
    assert md_names(kubectl) == []
    kubectl.run("apply", "-f", str(CLASSIFY), check=True)
    on_update = kubectl.run("apply", "-f", "-", input_text=manifest)
    assert (
        on_update.returncode != 0 and 'unknown field "spec.swapPolicy.idleAftr"' in on_update.stderr
    )


def test_server_dry_run_changes_nothing(kubectl: Kubectl) -> None:
    dry = kubectl.run("apply", "--dry-run=server", "-f", "examples/", check=True).stdout
    assert "(server dry run)" in dry
    assert md_names(kubectl) == []
    kubectl.run("apply", "-f", str(CLASSIFY), check=True)
    idle_after = CLASSIFY_POLICY["idleAfter"]
    changed = CLASSIFY.read_text().replace(f"idleAfter: {idle_after}", "idleAfter: 1h")
    assert changed != CLASSIFY.read_text()
    kubectl.run("apply", "--dry-run=server", "-f", "-", input_text=changed, check=True)
    got = kubectl.run(
        "get", "md", "classify", "-o", "jsonpath={.spec.swapPolicy.idleAfter}", check=True
    )
    assert got.stdout == idle_after


def test_delete_waits_for_finalizers(api: EmulatorThread, kubectl: Kubectl) -> None:
    kubectl.run("apply", "-f", str(CLASSIFY), check=True)
    kubectl.run("patch", "md", "classify", "--type=merge",
                "-p", '{"metadata":{"finalizers":["modelswap.io/cleanup"]}}', check=True)  # fmt: skip
    kubectl.run("delete", "md", "classify", "--wait=false", check=True)
    held = kubectl.run(
        "get", "md", "classify", "-o", "jsonpath={.metadata.deletionTimestamp}", check=True
    )
    assert held.stdout
    kubectl.run("patch", "md", "classify", "--type=json",
                "-p", '[{"op":"remove","path":"/metadata/finalizers"}]', check=True)  # fmt: skip
    assert md_names(kubectl) == []


def test_builtin_apply_uses_strategic_merge(kubectl: Kubectl) -> None:
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: '1'\n  b: '2'\n"
    assert "created" in kubectl.run("apply", "-f", "-", input_text=cm, check=True).stdout
    changed = cm.replace("  b: '2'\n", "  c: '3'\n")
    assert "configured" in kubectl.run("apply", "-f", "-", input_text=changed, check=True).stdout
    data = kubectl.run("get", "cm", "settings", "-o", "jsonpath={.data}", check=True).stdout
    assert data == '{"a":"1","c":"3"}'


def test_explain_reads_the_crd_schema(kubectl: Kubectl) -> None:
    explained = kubectl.run("explain", "md.spec.swapPolicy", check=True).stdout
    assert "idleAfter" in explained and "onSwapOut" in explained


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_apply_of_each_invalid_file_fails_naming_its_field(
    shared_kubectl: Kubectl, path: Path
) -> None:
    field = re.search(r"^# expect: (\S+)", path.read_text(), re.MULTILINE)
    assert field is not None
    result = shared_kubectl.run("apply", "-f", str(path))
    assert result.returncode != 0
    assert field.group(1) in result.stderr, result.stderr
    if "strict decoding error" not in result.stderr:
        name = re.search(r"^  name: (\S+)", path.read_text(), re.MULTILINE)
        assert name is not None
        assert f'The ModelDeployment "{name.group(1)}" is invalid' in result.stderr


def test_imperative_creates_sent_as_protobuf_work(api: EmulatorThread) -> None:
    kubectl = Kubectl(api.kubeconfig_path, api.home)
    kubectl.run("create", "namespace", "models", check=True)
    kubectl.run("create", "configmap", "c", "-n", "models", "--from-literal=a=b", check=True)
    kubectl.run(
        "create", "secret", "generic", "s", "-n", "models", "--from-literal=t=xyz", check=True
    )
    kubectl.run("create", "serviceaccount", "bot", "-n", "models", check=True)
    secret = kubectl.run(
        "get", "secret", "s", "-n", "models", "-o", "jsonpath={.type} {.data.t}", check=True
    )
    assert secret.stdout == "Opaque eHl6"
    assert (
        kubectl.run("get", "cm", "c", "-n", "models", "-o", "jsonpath={.data.a}", check=True).stdout
        == "b"
    )
    kubectl.run("delete", "namespace", "models", check=True)
    assert "No resources found" in kubectl.run("get", "cm,secret,sa", "-n", "models").stderr


def test_get_watch_prints_rows_as_objects_change(api: EmulatorThread, kubectl: Kubectl) -> None:
    watcher = subprocess.Popen(
        [str(KUBECTL), f"--cache-dir={kubectl.cache_dir}", "get", "md", "--watch"],
        env=kubectl.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in watcher.stdout or ()])
    reader.start()
    try:
        store = api.emulator.cluster.store  # type: ignore[union-attr]
        key = ("modelswap.io", "modeldeployments")
        wait_for(lambda: api.call(lambda: store.watcher_count(key)), what="kubectl's watch")
        kubectl.run("apply", "-f", str(CLASSIFY), check=True)
        assert lines.get(timeout=10).split()[:3] == ["NAME", "MODEL", "NODE"]
        # No operator here writes status.modelName: only the name and the age are filled.
        row = lines.get(timeout=10).split()
        assert row[0] == "classify" and re.fullmatch(r"\d+s", row[1]) and len(row) == 2, row
    finally:
        os.killpg(watcher.pid, signal.SIGKILL)
        watcher.wait(10)
        reader.join(10)
        for stream in (watcher.stdout, watcher.stderr):
            if stream is not None:
                stream.close()


def test_server_side_apply_removes_fields_the_manager_stopped_applying(
    api: EmulatorThread, kubectl: Kubectl
) -> None:
    applied = kubectl.run("apply", "--server-side", "-f", str(CLASSIFY), check=True).stdout
    assert "serverside-applied" in applied
    with api_client(api.kubeconfig_path) as kube:  # another writer's label must survive
        client.CustomObjectsApi(kube).patch_namespaced_custom_object(
            "modelswap.io", "v1alpha1", "default", "modeldeployments", "classify",
            {"metadata": {"labels": {"team": "ml"}}},
        )  # fmt: skip
    min_resident = CLASSIFY_POLICY["minResident"]
    without_min_resident = CLASSIFY.read_text().replace(f"    minResident: {min_resident}\n", "")
    assert without_min_resident != CLASSIFY.read_text()
    kubectl.run("apply", "--server-side", "-f", "-", input_text=without_min_resident, check=True)
    policy = kubectl.run("get", "md", "classify", "-o", "jsonpath={.spec.swapPolicy}", check=True)
    idle_after = CLASSIFY_POLICY["idleAfter"]
    assert "minResident" not in policy.stdout and f'"idleAfter":"{idle_after}"' in policy.stdout
    label = kubectl.run(
        "get", "md", "classify", "-o", "jsonpath={.metadata.labels.team}", check=True
    )
    assert label.stdout == "ml"
