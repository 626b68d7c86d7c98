"""Vouching for python-backend stub processes, read from /proc.

A client that registers with the agent names its model; the agent accepts it only from a
process the runtime driver vouches for (DESIGN.md §3). For Triton that is a descendant of
the agent's Triton whose stub command line names the model. Triton starts each instance as

    triton_python_backend_stub <repository>/<model>/<version>/model.py <shm region> ...

so "names the model" means: the program is `triton_python_backend_stub` and its first
argument has a `<model>/<version>/` pair of path components. The model directory is the
Triton model name (`m-<uid>`), which the driver chose, so it cannot be confused with another
model's. A stale pid reused by an unrelated process fails both checks.

The same checks guard `TritonVoucher.kill`: the agent ends a stub that answers nothing
(issue 26, item 6) only while it is still that model's stub under the current Triton,
through a pidfd opened before the checks, so a pid reused after them is never signalled.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

PROC = Path("/proc")
STUB_PROGRAM = "triton_python_backend_stub"


def _parent_pid(pid: int, proc: Path) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def _command_line(pid: int, proc: Path) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def is_descendant(pid: int, ancestor_pid: int, *, proc: Path = PROC) -> bool:
    """True when `ancestor_pid` is a (strict) ancestor of `pid`."""
    seen: set[int] = set()
    current: int | None = pid
    while current is not None and current > 1 and current not in seen:
        seen.add(current)
        current = _parent_pid(current, proc)
        if current == ancestor_pid:
            return True
    return False


def stub_names_model(command_line: list[str], model_name: str) -> bool:
    """True when `command_line` is a python-backend stub's serving `model_name`."""
    if len(command_line) < 2 or Path(command_line[0]).name != STUB_PROGRAM:
        return False
    parts = Path(command_line[1]).parts
    return any(parts[i] == model_name and parts[i + 1].isdigit() for i in range(len(parts) - 2))


def vouches(triton_pid: int, pid: int, model_name: str, *, proc: Path = PROC) -> bool:
    """True when `pid` is a stub of `model_name` under the Triton whose pid is `triton_pid`."""
    return stub_names_model(_command_line(pid, proc), model_name) and is_descendant(
        pid, triton_pid, proc=proc
    )


def descendant_stub_pids(triton_pid: int, model_name: str, *, proc: Path = PROC) -> list[int]:
    """Pids of the stub processes of `model_name` under Triton `triton_pid`, ascending."""
    found = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            if pid != triton_pid and vouches(triton_pid, pid, model_name, proc=proc):
                found.append(pid)
    return sorted(found)


class KillOutcome(enum.StrEnum):
    KILLED = "killed"  # SIGKILL sent
    GONE = "gone"  # no such process (any more)
    NOT_A_STUB = "not-a-stub"  # not that model's stub under the current Triton: left alone
    NOT_PERMITTED = "not-permitted"  # another uid's process, and no CAP_KILL


def process_state(pid: int, *, proc: Path = PROC) -> str:
    """The process's state letter from /proc (`T`: stopped, `Z`: exited, not reaped);
    '' when it is gone or unreadable."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0] if fields else ""


def kill_stub(
    triton_pid: int | None, pid: int, model_name: str, *, proc: Path = PROC
) -> KillOutcome:
    """SIGKILL `pid` if it is a stub of `model_name` under Triton `triton_pid`. The pidfd
    is opened first: a pid reused after the checks names another process than the fd."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return KillOutcome.GONE
    try:
        if triton_pid is None or not vouches(triton_pid, pid, model_name, proc=proc):
            return KillOutcome.NOT_A_STUB
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            return KillOutcome.GONE
        except PermissionError:
            return KillOutcome.NOT_PERMITTED
        return KillOutcome.KILLED
    finally:
        with contextlib.suppress(OSError):
            os.close(pidfd)


class TritonVoucher:
    """The engine's `Voucher` for models served by one Triton.

    `triton_pid` returns the pid of the current Triton (None while none runs: nothing is
    vouched for); the supervisor restarts Triton, so it is asked on every call.
    `triton_name` maps the model name a client registers with to its Triton model name
    (identity by default: clients register with the Triton name).
    """

    def __init__(
        self,
        triton_pid: Callable[[], int | None],
        triton_name: Callable[[str], str | None] = lambda model: model,
        *,
        proc: Path = PROC,
    ) -> None:
        self._triton_pid = triton_pid
        self._triton_name = triton_name
        self._proc = proc

    def vouch(self, pid: int, model: str) -> bool:
        triton_pid = self._triton_pid()
        name = self._triton_name(model)
        if triton_pid is None or name is None:
            log.debug("not vouching for pid %d as %r: no Triton or no such model", pid, model)
            return False
        return vouches(triton_pid, pid, name, proc=self._proc)

    def kill(self, pid: int, model: str) -> KillOutcome:
        """End `pid` (SIGKILL) if it is a stub of `model` under the current Triton."""
        return kill_stub(self._triton_pid(), pid, self._triton_name(model) or "", proc=self._proc)
