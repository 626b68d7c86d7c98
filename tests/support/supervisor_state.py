"""A test's handle on one `modelswap node` supervisor: its state file, and the process group
of every child it has reported, so that closing leaves nothing running."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from modelswap_sidecar.triton.process import remove_shm_regions


def read_state(state_file: Path, pgids: set[int]) -> dict[str, Any]:
    """The supervisor's state file ({} until it is written); the pid of every child it
    reports joins `pgids` (each child leads its own process group)."""
    try:
        data: dict[str, Any] = json.loads(state_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    for child in data.get("children", {}).values():
        if child.get("pid"):
            pgids.add(child["pid"])
    return data


class SupervisorHandle:
    """Base of the tests' node handles; a subclass starts `proc` (in its own session)."""

    def __init__(self, state_file: Path, shm_prefix: str) -> None:
        self.state_file = state_file
        self.shm_prefix = shm_prefix
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgids: set[int] = set()

    def state(self) -> dict[str, Any]:
        return read_state(self.state_file, self.pgids)

    def child(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.state().get("children", {}).get(name, {})
        return found

    def kill_all(self, *, term_timeout_s: float) -> None:
        """Stop the supervisor as a kubelet would (it reaps its children); SIGKILL all
        groups only if it does not exit in time. Removes its Triton's shm regions."""
        self.state()
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=term_timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        for pgid in self.pgids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        remove_shm_regions(self.shm_prefix)
