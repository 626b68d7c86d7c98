"""Test-side handles on engine agent and client processes (each in its own process group).

Every process started here is killed as a group by `Procs.cleanup()`; `shm_procs` calls
it (and removes the work folder) for the tests' fixtures.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    def __init__(self, args: list[str], name: str) -> None:
        self.name = name
        self.popen = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill9(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def close(self) -> None:
        if self.popen.poll() is None:
            self.kill9()
        for f in (self.popen.stdin, self.popen.stdout):
            if f is not None:
                f.close()


class ClientProc(Proc):
    def __init__(self, model: str) -> None:
        super().__init__(["-m", "tests.support.engine_client"], "client")
        self.model = model

    def call(self, **cmd: Any) -> dict[str, Any]:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(json.dumps(cmd) + "\n")
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            raise AssertionError(f"client {self.pid} exited ({self.popen.poll()})")
        result: dict[str, Any] = json.loads(line)
        return result

    def ok(self, **cmd: Any) -> dict[str, Any]:
        result = self.call(**cmd)
        assert result["ok"], result
        return result


class AgentProc(Proc):
    def __init__(
        self, workdir: Path, gpu_bytes: list[str], models: list[str], extra: list[str] | None = None
    ) -> None:
        self.socket = str(workdir / "agent.sock")
        self.control = str(workdir / "control.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.control)
        args = [
            "-m",
            "tests.support.engine_agent",
            "--socket",
            self.socket,
            "--control",
            self.control,
            "--store",
            str(workdir / "store"),
        ]
        for g in gpu_bytes:
            args += ["--gpu-bytes", g]
        for m in models:
            args += ["--model", m]
        super().__init__(args + (extra or []), "agent")
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        assert line.strip() == "ready", f"agent did not start: {line!r}"

    def wait_paused(self, checkpoint: str, timeout: float = 30.0) -> None:
        """Block until the agent (started with `--pause-at`) stopped at `checkpoint`."""
        assert self.popen.stdout is not None
        ready, _, _ = select.select([self.popen.stdout], [], [], timeout)
        assert ready, f"agent did not reach {checkpoint} in {timeout} s"
        line = self.popen.stdout.readline().strip()
        assert line == f"paused {checkpoint}", f"agent said {line!r}"

    def call(self, **cmd: Any) -> dict[str, Any]:
        """One control command on its own connection (so calls may run concurrently)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(self.control)
            with conn.makefile("rw") as f:
                f.write(json.dumps(cmd) + "\n")
                f.flush()
                line = f.readline()
        if not line:
            raise AssertionError("agent control connection closed")
        result: dict[str, Any] = json.loads(line)
        return result

    def ok(self, **cmd: Any) -> dict[str, Any]:
        result = self.call(**cmd)
        assert result["ok"], result
        return result

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.ok(cmd="status")["status"]
        return status


class Background:
    """A call run on a thread whose outcome (result or exception) the test reads later.

    For calls a killed agent interrupts: the exception is kept, never left unhandled.
    """

    def __init__(self, fn: Any, **kwargs: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, kwargs), daemon=True)
        self._thread.start()

    def _run(self, fn: Any, kwargs: dict[str, Any]) -> None:
        try:
            self.result = fn(**kwargs)
        except BaseException as e:
            self.error = e

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float = 60.0) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "background call still running"
        return self.result


class Procs:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.all: list[Proc] = []

    def agent(
        self, gpu_bytes: list[str], models: list[str], extra: list[str] | None = None
    ) -> AgentProc:
        a = AgentProc(self.workdir, gpu_bytes, models, extra)
        self.all.append(a)
        return a

    def client(self, agent: AgentProc, model: str, vouch: bool = True) -> ClientProc:
        c = ClientProc(model)
        self.all.append(c)
        if vouch:
            agent.ok(cmd="vouch", pid=c.pid, model=model)
        return c

    def cleanup(self) -> None:
        for p in reversed(self.all):
            p.close()


@contextlib.contextmanager
def shm_procs(prefix: str) -> Iterator[Procs]:
    """`Procs` working in a fresh /dev/shm folder; processes killed, folder removed after."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir="/dev/shm"))
    p = Procs(workdir)
    try:
        yield p
    finally:
        p.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


# -- independent checks through /proc ---------------------------------------------------

MAPS_LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ (\d+)\s*(.*)$")


def memfd_mappings(pid: int) -> list[tuple[int, int, str, int]]:
    """(start, end, perms, inode) of every memfd mapping in the process."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            m = MAPS_LINE.match(line.strip())
            if m and m.group(5).startswith("/memfd:"):
                out.append((int(m.group(1), 16), int(m.group(2), 16), m.group(3), int(m.group(4))))
    return out


def mappings(pid: int) -> list[tuple[int, int, str, str]]:
    """(start, end, perms, path) of every file-backed mapping of the process."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            m = MAPS_LINE.match(line.strip())
            if m and m.group(5):
                out.append((int(m.group(1), 16), int(m.group(2), 16), m.group(3), m.group(5)))
    return out


def file_mappings(pid: int, under: str) -> list[tuple[str, str]]:
    """(perms, path) of every mapping of a file below `under`."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            m = MAPS_LINE.match(line.strip())
            if m and m.group(5).startswith(under):
                out.append((m.group(3), m.group(5)))
    return out


def open_files(pid: int) -> list[tuple[int, str, int]]:
    """(fd, target, open flags) of every fd of the process."""
    out = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            with open(f"/proc/{pid}/fdinfo/{name}") as f:
                flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
        except (FileNotFoundError, StopIteration):
            continue
        out.append((int(name), target, flags))
    return out


def memfd_fd_inodes(pid: int) -> dict[int, int]:
    """inode → size of every memfd the process holds an fd for (fstat through /proc)."""
    out = {}
    for fd, target, _ in open_files(pid):
        if target.startswith("/memfd:"):
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(f"/proc/{pid}/fd/{fd}")
                out[st.st_ino] = st.st_size
    return out
