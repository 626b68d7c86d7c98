"""Where the agent learns the current Triton's pid (it changes when Triton restarts).

Stub vouching follows the pid (a client is accepted only from a descendant of the current
Triton) and a new pid tells the agent to reload every model. Sources: a file holding the
pid (local mode, tests), or the node supervisor's state file (`children.runtime.pid`).
Read on every call: both are small and replaced atomically.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

RUNTIME_CHILD = "runtime"


class TritonPidSource:
    def __init__(self, *, pid_file: Path | None, supervisor_state_file: Path | None) -> None:
        self.pid_file = pid_file
        self.supervisor_state_file = supervisor_state_file

    def __call__(self) -> int | None:
        """The current Triton's pid; None while none is known to run."""
        if self.pid_file is not None:
            try:
                text = self.pid_file.read_text().strip()
            except OSError:
                return None
            return int(text) if text.isdigit() else None
        if self.supervisor_state_file is not None:
            try:
                doc = json.loads(self.supervisor_state_file.read_text())
                child = doc["children"][RUNTIME_CHILD]
            except (OSError, ValueError, KeyError, TypeError):
                return None
            pid = child.get("pid") if child.get("running") else None
            return int(pid) if isinstance(pid, int) else None
        return None
