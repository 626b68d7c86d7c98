"""`modelswap up` for tests of the real example models: one local node (the supervisor
running the agent on a sim GPU and real Triton, the gateway on localhost) serving a
folder of ModelDeployment files from a model root of the test's own.

    with local_up(files, model_root, sim_gpu_bytes="256Mi") as node:
        node.wait_phase("embed", "Resident", timeout_seconds=120)
        node.post("/v2/models/embed/infer", body)
        node.swap("embed", "out")
        node.kill_triton()                     # kill -9; the supervisor restarts it

It runs in its own process group under a short temporary folder (the agent's Unix
socket path must stay under 108 bytes); leaving the block stops it with SIGINT, as
Ctrl-C does, and fails the test if any process of the run or Triton shm region is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.triton_server import tritonserver_binary
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class LocalNode:
    process: subprocess.Popen[bytes]
    folder: Path
    run_dir: Path
    log_path: Path
    state: dict[str, Any]

    @property
    def gateway(self) -> str:
        return str(self.state["gatewayUrl"])

    def _headers(self) -> dict[str, str]:
        token = Path(self.state["tokenFile"]).read_text().strip()
        return {"Authorization": f"Bearer {token}"}

    def models(self) -> dict[str, dict[str, Any]]:
        """The agent's models by ModelDeployment name (control API `GET /v1/models`)."""
        self.check_running()
        r = httpx.get(
            f"{self.state['controlUrl']}/v1/models",
            headers=self._headers(),
            timeout=10,
            trust_env=False,
        )
        r.raise_for_status()
        return {m["name"]: m for m in r.json()["models"]}

    def model(self, name: str) -> dict[str, Any]:
        return self.models()[name]

    def wait_phase(self, name: str, phase: str, timeout_seconds: float = 60) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            found = self.models().get(name)
            return found if found is not None and found["phase"] == phase else None

        return wait_for(reached, timeout_seconds, f"{name} to be {phase}")

    def swap(self, name: str, direction: str) -> dict[str, Any]:
        """A manual swap (`out` or `in`) through the control API; its answer."""
        uid = self.model(name)["uid"]
        r = httpx.post(
            f"{self.state['controlUrl']}/v1/models/{uid}/swap-{direction}",
            headers=self._headers(),
            timeout=60,
            trust_env=False,
        )
        answer: dict[str, Any] = r.json()
        return answer

    def post(self, path: str, body: dict[str, Any], timeout_seconds: float = 120) -> httpx.Response:
        return httpx.post(
            f"{self.gateway}{path}", json=body, timeout=timeout_seconds, trust_env=False
        )

    def supervisor(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads((self.run_dir / "supervisor.json").read_text())
        except (OSError, ValueError):
            return {}
        return state

    def triton_pid(self) -> int | None:
        child = self.supervisor().get("children", {}).get("runtime", {})
        pid = child.get("pid")
        return int(pid) if child.get("running") and pid else None

    def kill_triton(self) -> int:
        """kill -9 of the running tritonserver; waits until the supervisor has started the
        next one and returns its pid."""
        old = self.triton_pid()
        assert old is not None, "Triton is not running"
        os.kill(old, signal.SIGKILL)

        def restarted() -> int | None:
            self.check_running()
            pid = self.triton_pid()
            return pid if pid is not None and pid != old else None

        return wait_for(restarted, 60, "the supervisor to restart Triton")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def check_running(self) -> None:
        assert self.process.poll() is None, f"modelswap up exited:\n{self.log()[-6000:]}"


def leftovers(run_dir: Path, shm_prefix: str | None, pgid: int) -> dict[str, int | None]:
    """Processes of the run (its run directory on their command line, or in its process
    group) and Triton shm regions still present: description → pid (None for a file)."""
    found: dict[str, int | None] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            group = os.getpgid(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
        if str(run_dir).encode() in cmdline or group == pgid:
            shown = cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]
            found[f"process {entry.name}: {shown}"] = int(entry.name)
    if shm_prefix:
        found.update((f"shm region {p}", None) for p in Path("/dev/shm").glob(f"{shm_prefix}*"))
    return found


def start_up(
    folder: Path,
    files: dict[str, str],
    run_dir: Path,
    log_path: Path,
    model_root: Path,
    *flags: str,
) -> subprocess.Popen[bytes]:
    """Write `files` into `folder` and start `modelswap up` over it in its own process
    group (its output in `log_path`); `flags` are added to the command line."""
    tritonserver_binary()  # fails clearly when `make setup` has not installed Triton
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    command = [
        sys.executable, "-m", "modelswap_api.cli", "up", "-f", str(folder),
        "--model-root", str(model_root), "--run-dir", str(run_dir), "--port", "0", *flags,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
        )


def wait_pushed(
    process: subprocess.Popen[bytes], run_dir: Path, log_path: Path, *, until_pushed: bool = True
) -> dict[str, Any]:
    """local.json once `modelswap up` runs and has pushed its models (`until_pushed`), or
    once it names its addresses; fails with the log if the process ends first."""

    def ready() -> dict[str, Any] | None:
        assert process.poll() is None, log_path.read_text(errors="replace")
        with contextlib.suppress(OSError, ValueError):
            state = json.loads((run_dir / "local.json").read_text())
            if state.get("running") and (state.get("pushes", 0) >= 1 or not until_pushed):
                return dict(state)
        return None

    return wait_for(ready, timeout_seconds=60, what="modelswap up to push its models")


def stop_up(process: subprocess.Popen[bytes]) -> None:
    """SIGINT to the group, as Ctrl-C does; SIGKILL after 60 s."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextlib.contextmanager
def local_up(
    files: dict[str, str], model_root: Path, *, sim_gpu_bytes: str = "256Mi"
) -> Iterator[LocalNode]:
    """`modelswap up` over `files` (name → YAML text) with `/models/<x>` sources under
    `model_root`, yielded once it has pushed them to its agent."""
    tmp = Path(tempfile.mkdtemp(prefix="ms-up-"))
    folder, run_dir, log_path = tmp / "deployments", tmp / "run", tmp / "up.log"
    process = start_up(
        folder, files, run_dir, log_path, model_root,
        "--sim-gpu-bytes", sim_gpu_bytes, "--allocator", "sim",
        # these tests change model files under the running node on purpose (weights moved
        # away, a changed model): local mode's reload on change would race with them
        "--no-reload",
    )  # fmt: skip
    node = None
    failed = False
    try:
        node = LocalNode(
            process, folder, run_dir, log_path, wait_pushed(process, run_dir, log_path)
        )
        yield node
    except BaseException:
        failed = True
        print(f"--- modelswap up log ---\n{log_path.read_text(errors='replace')[-8000:]}")
        raise
    finally:
        shm_prefix = node.state.get("shmPrefix") if node else None
        stop_up(process)
        left = leftovers(run_dir, shm_prefix, process.pid)
        for pid in left.values():  # reported below; removed so later tests start clean
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if shm_prefix:
            for region in Path("/dev/shm").glob(f"{shm_prefix}*"):
                region.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        if not failed:
            assert not left, f"left running: {sorted(left)}"
