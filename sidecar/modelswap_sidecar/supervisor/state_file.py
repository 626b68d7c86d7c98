"""The supervisor's state as a small JSON file that its siblings can read.

The agent reads it to learn the runtime's current pid (stub vouching follows Triton across
restarts) and the restart counters (its metrics). The file is replaced atomically (write a
temporary file, then rename) on every start and exit, and is world-readable: it holds pids,
counters and names, nothing secret.

    {"supervisorPid": 1, "updatedAt": 1732300000.5, "stopping": false,
     "children": {"agent":   {"pid": 7, "running": true, "starts": 1, "restarts": 0,
                              "lastExit": null, "uid": 1000},
                  "runtime": {"pid": 9, "running": true, "starts": 2, "restarts": 1,
                              "lastExit": {"code": null, "signal": 9}, "uid": 1001}}}
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelswap_sidecar.supervisor.specs import ExitStatus


@dataclass(frozen=True)
class ChildState:
    name: str
    pid: int | None
    starts: int
    restarts: int
    last_exit: ExitStatus | None
    uid: int

    @property
    def running(self) -> bool:
        return self.pid is not None

    def to_json(self) -> dict[str, Any]:
        last_exit = None
        if self.last_exit is not None:
            last_exit = {"code": self.last_exit.code, "signal": self.last_exit.signal}
        return {
            "pid": self.pid,
            "running": self.running,
            "starts": self.starts,
            "restarts": self.restarts,
            "lastExit": last_exit,
            "uid": self.uid,
        }


@dataclass(frozen=True)
class SupervisorState:
    supervisor_pid: int
    updated_at_seconds: float
    stopping: bool
    children: tuple[ChildState, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "supervisorPid": self.supervisor_pid,
            "updatedAt": self.updated_at_seconds,
            "stopping": self.stopping,
            "children": {c.name: c.to_json() for c in self.children},
        }


def write_state(path: Path, state: SupervisorState) -> None:
    """Replace `path` with `state` atomically (mode 0644)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(state.to_json(), f, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_state(path: Path) -> dict[str, Any]:
    """The state as written (for siblings and tests)."""
    data: dict[str, Any] = json.loads(path.read_text())
    return data
