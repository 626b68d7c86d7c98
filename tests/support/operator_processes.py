"""`modelswap operator` as child processes (leader election between real processes, kill -9
of either), for the operator's integration and reliability tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from modelswap_sidecar.triton.process import free_loopback_port
from tests.support.agent_harness import spawn
from tests.support.kube_testing import REPO_ROOT
from tests.support.operator_world import (
    GRACE_SECONDS,
    NODE_LEASES,
    OPERATOR_NAMESPACE,
    write_defaults,
)


class OperatorProcess:
    """`modelswap operator` as a child process in its own process group."""

    def __init__(self, api: Any, workdir: Path, name: str) -> None:
        self.name = name
        self.port = free_loopback_port()
        self.log_path = workdir / f"{name}.log"
        self.command = [
            sys.executable, "-m", "modelswap_api.cli", "operator",
            "--kubeconfig", str(api.kubeconfig_path), "--identity", name,
            "--operator-namespace", OPERATOR_NAMESPACE, "--node-lease-namespace", NODE_LEASES,
            "--grace-seconds", str(GRACE_SECONDS), "--leader-lease-seconds", "2",
            "--leader-renew-seconds", "0.4", "--http-port", str(self.port),
            "--defaults", str(write_defaults(workdir)), "--plain-logs",
        ]  # fmt: skip
        self.popen: Any = None

    def start(self) -> None:
        self.popen = spawn(
            self.command, self.log_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        )

    def readyz(self) -> int | None:
        try:
            return httpx.get(
                f"http://127.0.0.1:{self.port}/readyz", timeout=2, trust_env=False
            ).status_code
        except httpx.HTTPError:
            return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill9(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> int | None:
        if self.popen is None or self.popen.poll() is not None:
            return None if self.popen is None else int(self.popen.returncode)
        os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            return int(self.popen.wait(20))
        except subprocess.TimeoutExpired:
            self.kill9()
            return None
