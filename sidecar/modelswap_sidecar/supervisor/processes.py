"""The supervisor's side effects on processes: spawn, signal a group, reap, read /proc.

Every child starts in a session (and so a process group) of its own, whose id is the
child's pid; signals go to the whole group, so a child's own children (Triton's stubs)
get them too. The supervisor reaps with `waitpid(-1)`: as PID 1, or as a child subreaper
(`PR_SET_CHILD_SUBREAPER`, set by `become_subreaper`) when it is not, every orphan of the
subtree is reparented to it and would otherwise stay a zombie.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import subprocess
from pathlib import Path

from modelswap_sidecar.supervisor.specs import ChildSpec, ExitStatus

log = logging.getLogger(__name__)

PROC = Path("/proc")
_PR_SET_CHILD_SUBREAPER = 36


def spawn(spec: ChildSpec) -> subprocess.Popen[bytes]:
    """Start `spec` in a new session, as its user; raises OSError when it cannot be run.

    The returned Popen is never waited on: the supervisor reaps with `reap()`.
    """
    identity: dict[str, object] = {}
    if spec.run_as is not None:
        identity = {
            "user": spec.run_as.uid,
            "group": spec.run_as.gid,
            # Always given, so setgroups() also drops the supervisor's own groups.
            "extra_groups": list(spec.run_as.groups),
        }
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        list(spec.argv),
        env=dict(spec.env),
        cwd=spec.cwd,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        **identity,
    )


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to process group `pgid`; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # A member switched to a uid we cannot signal: only possible when not root.
        log.warning("not allowed to signal process group %d", pgid)
        return True
    return True


def reap() -> list[tuple[int, ExitStatus]]:
    """Reap every child that has exited (and any orphan reparented to us); never blocks."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        reaped.append((pid, ExitStatus.from_wait_status(status)))
    return reaped


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state is [0], ppid [1], pgrp [2])."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses.
    return stat[stat.rfind(")") + 2 :].split()


def _pids(proc: Path) -> list[int]:
    return [int(entry.name) for entry in proc.iterdir() if entry.name.isdigit()]


def group_members(pgid: int, *, proc: Path = PROC) -> list[int]:
    """Live (not zombie) processes of group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    members = []
    for pid in _pids(proc):
        fields = _stat_fields(pid, proc)
        if fields is not None and len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(pid)
    return sorted(members)


def children_of(ppid: int, *, proc: Path = PROC) -> list[int]:
    """Live (not zombie) processes whose parent is `ppid`."""
    found = []
    for pid in _pids(proc):
        fields = _stat_fields(pid, proc)
        if fields is not None and len(fields) > 1 and fields[0] != "Z" and int(fields[1]) == ppid:
            found.append(pid)
    return sorted(found)


def become_subreaper() -> bool:
    """Make orphans of our subtree our children (Linux ≥ 3.4); False where unsupported."""
    if os.getpid() == 1:
        return True  # orphans come to PID 1 anyway
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            return True
        code = ctypes.get_errno()
    except (OSError, AttributeError) as e:
        log.warning("cannot become a child subreaper: %s", e)
        return False
    log.warning("cannot become a child subreaper: %s", os.strerror(code or errno.EINVAL))
    return False


def kill_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
