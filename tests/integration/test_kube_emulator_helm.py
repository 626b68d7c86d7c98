"""helm v4 and v3 install, upgrade and uninstall a chart against the emulator (release
Secrets go through the protobuf path; no controllers run, so `--wait` is not used)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest
from kubernetes import client

from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import EMULATOR_DATA, REPO_ROOT, api_client

CHART = EMULATOR_DATA / "tiny-chart"


@pytest.fixture
def api() -> Iterator[EmulatorThread]:
    with EmulatorThread() as api:
        yield api


@pytest.mark.parametrize("helm", ["helm", "helm3"])
def test_install_upgrade_uninstall(api: EmulatorThread, helm: str) -> None:
    binary = REPO_ROOT / ".venv" / "bin" / helm
    env = dict(os.environ, KUBECONFIG=str(api.kubeconfig_path), HOME=str(api.home),
               HELM_CACHE_HOME=str(api.home / "cache"), HELM_CONFIG_HOME=str(api.home / "config"),
               HELM_DATA_HOME=str(api.home / "data"))  # fmt: skip

    def run(*args: str) -> str:
        done = subprocess.run([str(binary), *args], env=env, capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "STATUS: deployed" in run("install", "rel", str(CHART), "-n", "default")
    with api_client(api.kubeconfig_path) as kube:
        apps = client.AppsV1Api(kube)
        deployment = apps.read_namespaced_deployment("rel-op", "default")
        rbac = client.RbacAuthorizationV1Api(kube)
        assert [r.metadata.name for r in rbac.list_cluster_role().items] == ["rel-role"]
        assert deployment.spec.template.spec.service_account_name == "rel-sa"
        assert "REVISION: 2" in run("upgrade", "rel", str(CHART), "-n", "default")
        assert "rel" in run("list", "-n", "default")
        releases = client.CoreV1Api(kube).list_namespaced_secret(
            "default", label_selector="owner=helm"
        )
        assert sorted(s.metadata.name for s in releases.items) == [
            "sh.helm.release.v1.rel.v1", "sh.helm.release.v1.rel.v2",
        ]  # fmt: skip
        run("uninstall", "rel", "-n", "default")
        assert apps.list_namespaced_deployment("default").items == []
        assert client.CoreV1Api(kube).list_namespaced_secret("default").items == []
        assert rbac.list_cluster_role().items == []
