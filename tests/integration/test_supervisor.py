"""`modelswap node` as a real process with small shell children, and once with real Triton.

The fake `tritonserver` is a shell script that takes Triton's command line, creates a
region file with the shm prefix it was given (named after its own pid), starts a "stub"
that ignores SIGTERM and SIGHUP (only a group SIGKILL ends it), records the signals it
gets, and waits. The fake agent records its signals and leaves an orphan behind.
Everything runs in a private folder under /tmp (world-readable, so children switched to
`nobody` can run the scripts); each test's finally kills whatever is left, as groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelswap_sidecar.supervisor.processes import group_members
from modelswap_sidecar.triton.process import pick_ports, shm_regions
from tests.support.supervisor_state import SupervisorHandle
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")

FAKE_TRITON = r"""#!/bin/sh
for a in "$@"; do
  case "$a" in --backend-config=python,shm-region-prefix-name=*) p="${a#*shm-region-prefix-name=}";; esac
done
: > "/dev/shm/${p}$$"
trap 'echo HUP >> "$FAKE_DIR/runtime.signals"' HUP
trap 'echo TERM >> "$FAKE_DIR/runtime.signals"; exit 0' TERM
trap 'echo INT >> "$FAKE_DIR/runtime.signals"; exit 0' INT
(trap '' HUP TERM; exec sleep 300) &
echo $! > "$FAKE_DIR/stub.pid"
while :; do sleep 1 & wait $!; done
"""

FAKE_AGENT = r"""#!/bin/sh
trap 'echo HUP >> "$FAKE_DIR/agent.signals"' HUP
trap 'echo TERM >> "$FAKE_DIR/agent.signals"; [ -n "$IGNORE_TERM" ] || exit 0' TERM
trap 'echo INT >> "$FAKE_DIR/agent.signals"; exit 0' INT
(sleep 0.5 & echo $! > "$FAKE_DIR/orphan.pid")
while :; do sleep 1 & wait $!; done
"""

QUICK_EXIT_AGENT = "#!/bin/sh\nexit 3\n"


def alive(pid: int) -> bool:
    """Running, or a zombie nobody reaped (`/proc/<pid>` exists)."""
    return Path(f"/proc/{pid}").exists()


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def read_pid(path: Path) -> int | None:
    """The pid a fake child wrote to `path`, once it is there."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text else None


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


class Node(SupervisorHandle):
    """One `modelswap node` under test; `close()` leaves nothing running."""

    def __init__(self, folder: Path, shm_prefix: str) -> None:
        super().__init__(folder / "state.json", shm_prefix)
        self.dir = folder
        self.log = folder / "supervisor.log"

    def start(self, *args: str, agent: str = FAKE_AGENT, triton: Path | None = None,
              env: dict[str, str] | None = None) -> None:  # fmt: skip
        agent_path = self.dir / "agent.sh"
        agent_path.write_text(agent)
        triton_path = self.dir / "tritonserver"
        triton_path.write_text(FAKE_TRITON)
        for path in (agent_path, triton_path):
            path.chmod(0o755)
        (self.dir / "repository").mkdir(exist_ok=True)
        command = [
            sys.executable, "-m", "modelswap_api.cli", "node",
            f"--tritonserver={triton or triton_path}",
            f"--model-repository={self.dir / 'repository'}",
            f"--shm-prefix={self.shm_prefix}",
            f"--state-file={self.state_file}",
            *args,
            "--", str(agent_path),
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, "FAKE_DIR": str(self.dir), **(env or {})},
                start_new_session=True,
            )

    def running_pid(self, name: str, *, not_pid: int | None = None, timeout: float = 10.0) -> int:
        def ready() -> int | None:
            pid = self.child(name).get("pid")
            return pid if pid and pid != not_pid and alive(pid) else None

        pid: int = wait_for(ready, timeout, f"{name} running{self.tail()}")
        return pid

    def signals(self, name: str) -> list[str]:
        path = self.dir / f"{name}.signals"
        return path.read_text().split() if path.exists() else []

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"supervisor still running after {timeout}s{self.tail()}"
            ) from None

    def tail(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n--- supervisor log ---\n" + text[-4000:]

    def close(self) -> None:
        self.kill_all(term_timeout_s=15)


@pytest.fixture
def node() -> Iterator[Node]:
    folder = Path(tempfile.mkdtemp(prefix="ms-supervisor-"))
    folder.chmod(0o777)  # children switched to nobody write their signal files here
    prefix = f"triton_python_backend_shm_region_mssup{uuid.uuid4().hex[:10]}_"
    under_test = Node(folder, prefix)
    try:
        yield under_test
    finally:
        under_test.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_killed_children_are_restarted_and_a_dead_triton_leaves_no_shm_or_stub(node: Node) -> None:
    node.start()
    agent = node.running_pid("agent")
    triton = node.running_pid("runtime")
    stub = wait_for(lambda: read_pid(node.dir / "stub.pid"), 10, "stub pid")
    first_region = SHM / f"{node.shm_prefix}{triton}"
    assert first_region.exists()

    os.kill(agent, signal.SIGKILL)
    new_agent = node.running_pid("agent", not_pid=agent)
    assert node.child("agent")["restarts"] == 1
    assert node.child("agent")["lastExit"] == {"code": None, "signal": 9}
    assert node.child("runtime")["pid"] == triton  # Triton untouched by the agent's death

    os.kill(triton, signal.SIGKILL)  # the stub survives its Triton: the supervisor kills it
    new_triton = node.running_pid("runtime", not_pid=triton)
    assert not alive(stub), "the dead Triton's stub was left running"
    assert not first_region.exists(), "the dead Triton's shm region was not removed"
    wait_for((SHM / f"{node.shm_prefix}{new_triton}").exists, 10, "the new Triton's region")
    assert node.child("runtime")["restarts"] == 1
    assert node.child("agent")["pid"] == new_agent


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_stops_every_child_group_and_exits_zero(
    node: Node, stop: signal.Signals
) -> None:
    node.start("--stop-grace-seconds=10")
    agent = node.running_pid("agent")
    triton = node.running_pid("runtime")
    wait_for((node.dir / "stub.pid").exists, 10, "stub")
    assert group_members(agent) and group_members(triton)
    assert node.proc is not None
    supervisor = node.proc.pid
    os.kill(supervisor, stop)
    assert node.wait_exit(10) == 0, node.tail()
    forwarded = [stop.name.removeprefix("SIG")]
    assert node.signals("agent") == forwarded and node.signals("runtime") == forwarded
    for pgid in (agent, triton):
        assert group_members(pgid) == [], f"group {pgid} left running"
    assert not alive(agent) and not alive(triton)
    assert not any(p.name.startswith(node.shm_prefix) for p in SHM.iterdir())
    assert json.loads(node.state_file.read_text())["stopping"] is True


def test_sighup_is_forwarded_to_both_groups_without_restarts(node: Node) -> None:
    node.start()
    agent = node.running_pid("agent")
    triton = node.running_pid("runtime")
    assert node.proc is not None
    os.kill(node.proc.pid, signal.SIGHUP)
    wait_for(lambda: node.signals("agent") == ["HUP"] and node.signals("runtime") == ["HUP"],
             10, "SIGHUP in both children")  # fmt: skip
    assert node.child("agent")["pid"] == agent and node.child("runtime")["pid"] == triton
    assert node.child("agent")["restarts"] == node.child("runtime")["restarts"] == 0


def test_orphans_of_the_subtree_are_reaped(node: Node) -> None:
    node.start()
    node.running_pid("agent")
    orphan = wait_for(lambda: read_pid(node.dir / "orphan.pid"), 10, "orphan pid")
    # The orphan's parent exited at once: it is reparented to the supervisor (a subreaper
    # when not PID 1), exits after 0.5 s, and must not stay a zombie.
    assert node.proc is not None
    supervisor = node.proc.pid
    wait_for(lambda: parent_of(orphan) == supervisor, 5, "orphan reparented to the supervisor")
    wait_for(lambda: not alive(orphan), 10, f"orphan {orphan} reaped{node.tail()}")


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(node: Node) -> None:
    node.start("--stop-grace-seconds=1", env={"IGNORE_TERM": "1"})
    agent = node.running_pid("agent")
    node.running_pid("runtime")
    assert node.proc is not None
    began = time.monotonic()
    os.kill(node.proc.pid, signal.SIGTERM)
    assert node.wait_exit(10) == 0
    assert time.monotonic() - began >= 0.9
    assert node.signals("agent") == ["TERM"]
    assert not alive(agent) and group_members(agent) == []
    assert "agent still running: killing its group" in node.tail()


def test_gives_up_on_a_crash_looping_child_and_stops_the_other(node: Node) -> None:
    config = node.dir / "node.yaml"
    config.write_text(
        "restart: {initialBackoffSeconds: 0.05, maxBackoffSeconds: 0.1, giveUpAfterRestarts: 3}\n"
    )
    node.start(f"--config={config}", agent=QUICK_EXIT_AGENT)
    triton = node.running_pid("runtime")
    assert node.wait_exit(20) == 1
    assert not alive(triton) and group_members(triton) == []
    assert node.child("agent")["starts"] == 4
    assert node.child("agent")["lastExit"] == {"code": 3, "signal": None}
    assert "giving up: agent: restarted 3 times" in node.tail()


def test_bad_settings_exit_2_naming_the_field(node: Node) -> None:
    config = node.dir / "node.yaml"
    config.write_text("triton: {httpPort: 0}\n")
    node.start(f"--config={config}")
    assert node.wait_exit(20) == 2
    assert "triton.httpPort: 0 is not a TCP port" in node.tail()


def test_root_runs_children_under_their_configured_uids(node: Node) -> None:
    if os.geteuid() != 0:
        pytest.skip("uid switching needs root")
    node.start("--agent-user=nobody", "--runtime-user=daemon")
    agent = node.running_pid("agent")
    triton = node.running_pid("runtime")
    agent_status, triton_status = proc_status(agent), proc_status(triton)
    assert agent_status["Uid"].split()[:2] == ["65534", "65534"]
    assert agent_status["Gid"].split()[0] == "65534"
    assert triton_status["Uid"].split()[:2] == ["1", "1"]
    # Root's supplementary groups are dropped: only the user's own.
    assert "0" not in agent_status["Groups"].split()
    assert "0" not in triton_status["Groups"].split()
    assert node.child("agent")["uid"] == 65534 and node.child("runtime")["uid"] == 1
    # The supervisor (root) still cleans up after the runtime's uid.
    os.kill(triton, signal.SIGKILL)
    node.running_pid("runtime", not_pid=triton)
    assert not (SHM / f"{node.shm_prefix}{triton}").exists()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_real_triton_killed_is_restarted_ready_and_its_shm_regions_removed(
    node: Node, tmp_path: Path
) -> None:
    import httpx

    from modelswap_sidecar.triton.driver import TritonDriver
    from modelswap_sidecar.triton.repository import ModelRepository
    from tests.support.triton_server import copy_model, new_uid, parameters_for, tritonserver_binary

    binary = tritonserver_binary()
    ports = pick_ports(metrics=False)
    repository = ModelRepository(node.dir / "repository")
    repository.create()
    node.start(f"--triton-http-port={ports.http}", f"--triton-grpc-port={ports.grpc}",
               "--stop-grace-seconds=10", triton=binary)  # fmt: skip
    url = f"127.0.0.1:{ports.http}"

    async def ready() -> None:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(timeout=1.0, trust_env=False) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"http://{url}/v2/health/ready")).status_code == 200:
                        return
                assert time.monotonic() < deadline, f"Triton not ready{node.tail()}"
                await asyncio.sleep(0.05)

    await ready()
    triton = node.running_pid("runtime")
    driver = TritonDriver(url, repository)
    try:
        uid = new_uid()
        await driver.load(uid, copy_model(tmp_path), parameters_for(uid, tmp_path / "agent.sock"))
        regions = shm_regions(node.shm_prefix)
        assert regions, "a loaded python-backend model keeps a region with our prefix"

        os.kill(triton, signal.SIGKILL)
        new_triton = node.running_pid("runtime", not_pid=triton, timeout=20)
        assert not any(r.exists() for r in regions), "the dead Triton's regions were left"
        assert group_members(triton) == [], "the dead Triton's stubs were left running"
        await ready()
        assert node.child("runtime")["restarts"] == 1 and node.child("runtime")["pid"] == new_triton
        # Explicit model control: the new Triton serves nothing until the agent reloads.
        assert not await driver.model_ready(uid)
    finally:
        await driver.close()
    assert node.proc is not None
    os.kill(node.proc.pid, signal.SIGTERM)
    assert node.wait_exit(20) == 0
    assert group_members(new_triton) == [] and shm_regions(node.shm_prefix) == []


def test_in_process_supervisor_for_local_mode_counts_restarts_and_stops_on_request(
    tmp_path: Path,
) -> None:
    """Local mode runs the class inside its own process: no signal handlers, no reaping of
    children that are not its own, stop on request from another thread."""
    import threading

    from modelswap_sidecar.supervisor.core import Supervisor
    from modelswap_sidecar.supervisor.restarts import RestartPolicy
    from modelswap_sidecar.supervisor.specs import ChildSpec

    cleaned: list[str] = []
    sleeper = ChildSpec(name="sleeper", argv=("sleep", "300"), env={"PATH": os.environ["PATH"]},
                        cleanup=lambda: cleaned.append("sleeper"))  # fmt: skip
    supervisor = Supervisor(
        [sleeper],
        policy=RestartPolicy(initial_backoff_seconds=0.01),
        stop_grace_seconds=5.0,
        reap_orphans=False,
    )
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(supervisor.run(install_signal_handlers=False))
    )
    thread.start()
    try:
        first = wait_for(lambda: supervisor.pid("sleeper"), 10, "sleeper started")
        os.kill(first, signal.SIGKILL)
        second = wait_for(
            lambda: (pid := supervisor.pid("sleeper")) and pid != first and pid, 10, "restart"
        )
        assert supervisor.restarts("sleeper") == 1
        supervisor.request_stop()
        thread.join(timeout=10)
        assert result == [0]
        assert not alive(second) and group_members(second) == []
        # Once before the first start, once after each exit.
        assert cleaned == ["sleeper"] * 3
    finally:
        supervisor.request_stop()
        thread.join(timeout=10)
