"""`modelswap sidecar` with cluster settings that cannot work here (a kubeconfig that does
not load, `inCluster` outside a pod) exits with status 2 and one line naming the key, no
traceback, and starts nothing (no socket, no endpoints file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def run_sidecar(tmp_path: Path, kube: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    token = tmp_path / "token"
    token.write_text("t" * 32)
    config = {
        "nodeName": "node-a",
        "gpus": [{"uuid": "sim-gpu-0", "capacityBytes": "64Mi"}],
        "hostStore": {"dir": str(tmp_path / "store")},
        "socketDir": str(tmp_path / "sock"),
        "stateDir": str(tmp_path / "state"),
        "sourceCache": {"dir": str(tmp_path / "cache")},
        "control": {"tokenFile": str(token), "host": "127.0.0.1", "port": 0},
        "triton": {"url": "127.0.0.1:9", "repository": str(tmp_path / "repo")},
        "kube": kube,
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    return subprocess.run(
        [sys.executable, "-m", "modelswap_api.cli", "sidecar", "--config", str(path)],
        capture_output=True, text=True, timeout=30, cwd=ROOT, env=env, check=False,
    )  # fmt: skip


@pytest.mark.timeout(60)
@pytest.mark.parametrize("content", [None, "{{ not: yaml", "apiVersion: v1\nkind: Config\n"])
def test_a_bad_kubeconfig_exits_2_naming_the_key(tmp_path: Path, content: str | None) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    if content is not None:
        kubeconfig.write_text(content)
    done = run_sidecar(tmp_path, {"kubeconfig": str(kubeconfig)})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("modelswap sidecar:")]
    assert len(lines) == 1 and lines[0].startswith(
        f"modelswap sidecar: kube.kubeconfig: {kubeconfig} cannot be used"
    ), done.stderr
    assert not (tmp_path / "sock").exists() and not (tmp_path / "state" / "agent.json").exists()


@pytest.mark.timeout(60)
def test_in_cluster_outside_a_cluster_exits_2_naming_the_key(tmp_path: Path) -> None:
    done = run_sidecar(tmp_path, {"inCluster": True})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "modelswap sidecar: kube.inCluster: no in-cluster service account here" in done.stderr
