"""Helpers for tests against the API emulator: clients, kubectl, manifests, waiting."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

REPO_ROOT = Path(__file__).resolve().parents[2]
KUBECTL = REPO_ROOT / ".venv" / "bin" / "kubectl"
EMULATOR_DATA = REPO_ROOT / "tests" / "data" / "emulator"


def load_yaml(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def api_client(kubeconfig_path: Path) -> client.ApiClient:
    made: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig_path)
    )
    return made


class Kubectl:
    """The real kubectl against one kubeconfig, with a private HOME and discovery cache."""

    def __init__(self, kubeconfig_path: Path, home: Path) -> None:
        if not KUBECTL.exists():
            raise RuntimeError(f"{KUBECTL} is missing: run `make setup`")
        self.env = dict(os.environ, KUBECONFIG=str(kubeconfig_path), HOME=str(home))
        self.cache_dir = home / "kube-cache"

    def run(
        self, *args: str, input_text: str | None = None, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(KUBECTL), f"--cache-dir={self.cache_dir}", *args],
            env=self.env,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO_ROOT,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}"
            )
        return result
