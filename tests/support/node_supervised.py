"""`modelswap node` with its real children for tests: the agent (`modelswap sidecar`) and
the real `tritonserver`, started as a subprocess in its own process group.

The agent's settings come from the agent harness (`Agent` writes them; the supervisor runs
it), with the supervisor's state file as its Triton pid source. `close()` leaves nothing
running: SIGTERM to the supervisor, then SIGKILL to its group and to every child group it
ever reported; Triton's shm regions with this run's prefix are removed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from modelswap_sidecar.triton.naming import triton_model_name
from modelswap_sidecar.triton.process import TritonPorts, pick_ports
from modelswap_sidecar.triton.stubs import descendant_stub_pids
from tests.support.agent_harness import ROOT, Agent, AgentConfig, Control, Models, eventually
from tests.support.supervisor_state import SupervisorHandle
from tests.support.triton_server import tritonserver_binary


@dataclass(frozen=True)
class TritonAddress:
    """What the harness's `Agent` and `Models` need to know of a Triton they do not run."""

    url: str
    repository: Path
    pid_file: Path  # unused: the agent reads the supervisor's state file
    ports: TritonPorts  # the supervisor's Triton listens on these (gRPC: the gateway's front)


class SupervisedNode(SupervisorHandle):
    def __init__(self, workdir: Path, config: AgentConfig | None = None) -> None:
        shm_prefix = f"triton_python_backend_shm_region_msnode{uuid.uuid4().hex[:10]}_"
        super().__init__(workdir / "supervisor.json", shm_prefix)
        self.dir = workdir
        self.log_path = workdir / "supervisor.log"
        self.ports = pick_ports(metrics=False)
        repository = workdir / "repository"
        repository.mkdir(parents=True, exist_ok=True)
        self.triton = TritonAddress(
            url=f"127.0.0.1:{self.ports.http}",
            repository=repository,
            pid_file=workdir / "unused.pid",
            ports=self.ports,
        )
        config = config or AgentConfig()
        config.extra.setdefault(
            "triton",
            {
                "url": self.triton.url,
                "repository": str(repository),
                "supervisorStateFile": str(self.state_file),
                "loadTimeoutSeconds": 60,
            },
        )
        self.agent = Agent(workdir, self.triton, config)  # type: ignore[arg-type]
        self.control = Control(self.agent.base_url)
        self.models = Models(self.triton)  # type: ignore[arg-type]

    # -- running it -----------------------------------------------------------------------

    async def start(self) -> None:
        command = [
            sys.executable, "-m", "modelswap_api.cli", "node",
            f"--tritonserver={tritonserver_binary()}",
            f"--model-repository={self.triton.repository}",
            f"--triton-http-port={self.ports.http}",
            f"--triton-grpc-port={self.ports.grpc}",
            f"--shm-prefix={self.shm_prefix}",
            f"--state-file={self.state_file}",
            "--stop-grace-seconds=20",
            "--",
            sys.executable, "-m", "modelswap_api.cli", "sidecar",
            "--config", str(self.agent.settings_file),
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once
                command,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        await self.agent_serving()
        await self.triton_ready()

    def _check_running(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"supervisor exited {self.proc.returncode}{self.tail()}")

    async def child_pid(self, name: str, *, not_pid: int | None = None) -> int:
        async def probe() -> int | None:
            self._check_running()
            child = self.child(name)
            pid = child.get("pid")
            return pid if child.get("running") and pid and pid != not_pid else None

        pid: int = await eventually(probe, timeout_seconds=30, what=f"{name} running")
        return pid

    async def agent_serving(self, *, not_pid: int | None = None) -> int:
        """The agent's pid once the agent the supervisor runs now serves its control API."""
        pid = await self.child_pid("agent", not_pid=not_pid)
        endpoints = self.agent.state_dir / "agent.json"

        async def serving() -> bool:
            self._check_running()
            try:
                return bool(json.loads(endpoints.read_text())["pid"] == pid)
            except (FileNotFoundError, ValueError, KeyError):
                return False

        await eventually(serving, timeout_seconds=30, what="the agent to serve")
        return pid

    async def triton_ready(self) -> None:
        async def ready() -> bool:
            self._check_running()
            try:
                r = await self.models.client.get("/v2/health/ready", timeout=1.0)
            except Exception:
                return False
            return r.status_code == 200

        await eventually(ready, timeout_seconds=30, what="Triton ready")

    def stub_pids(self, uid: str) -> list[int]:
        return descendant_stub_pids(self.child("runtime")["pid"], triton_model_name(uid))

    def stop(self, timeout_seconds: float = 30.0) -> int:
        """SIGTERM to the supervisor (as the kubelet sends it); its exit status."""
        assert self.proc is not None
        self.state()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"supervisor still running{self.tail()}") from None

    def tail(self, n: int = 6000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"\n--- supervisor + agent log ---\n{text[-n:]}"

    async def close(self) -> None:
        await self.control.close()
        await self.models.close()
        self.kill_all(term_timeout_s=20)
