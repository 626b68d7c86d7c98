"""What the supervisor runs: one frozen `ChildSpec` per child, and how a child ended."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from modelswap_sidecar.supervisor.identity import RunAs


@dataclass(frozen=True, kw_only=True)
class ChildSpec:
    """One supervised child. It runs in a session and process group of its own."""

    name: str
    argv: tuple[str, ...]
    #: The child's whole environment (nothing is inherited beyond it).
    env: Mapping[str, str] = field(default_factory=dict)
    #: None: the supervisor's own user.
    run_as: RunAs | None = None
    cwd: Path | None = None
    #: Runs once the child's whole process group is gone (after every exit, and once before
    #: the first start, for what an earlier run left): e.g. removing Triton's shm regions.
    cleanup: Callable[[], None] | None = None
    #: What a stop sends to the child's group first (SIGKILL follows after the grace period).
    stop_signal: int = signal.SIGTERM

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError(f"child {self.name!r}: empty argv")


@dataclass(frozen=True)
class ExitStatus:
    """How a child's process ended: `code` for an exit, `signal` for a kill."""

    code: int | None = None
    signal: int | None = None

    @classmethod
    def from_wait_status(cls, status: int) -> ExitStatus:
        if os.WIFSIGNALED(status):
            return cls(signal=os.WTERMSIG(status))
        return cls(code=os.WEXITSTATUS(status))

    @property
    def returncode(self) -> int:
        """As `subprocess` reports it: negative for a signal."""
        return -self.signal if self.signal is not None else (self.code or 0)

    def describe(self) -> str:
        if self.signal is not None:
            try:
                return f"killed by {signal.Signals(self.signal).name}"
            except ValueError:
                return f"killed by signal {self.signal}"
        return f"exited with status {self.code}"
