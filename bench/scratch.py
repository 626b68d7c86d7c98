"""Scratch directories for the benches, and the removal of those a killed bench left.

A bench's directories hold its node's host store and generated models (up to a few GiB,
in tmpfs: memory). A bench stopped by SIGTERM or Ctrl-C removes them on the way out; one
killed outright (SIGKILL, the machine restarting under it) cannot. So each directory
records its owner (pid and that process's start time, which a reused pid does not share),
and making a new one first removes every `modelswap-bench-*` directory beside it whose
owner is gone. A directory of a live bench, or one without an owner record (another tool's,
or one just made), is never touched. The processes a killed bench left running in a stale
directory (its node runs in its own process group, so it outlives the bench: `modelswap
up`, Triton and its stubs all name the directory on their command lines) are stopped
first: SIGTERM, and SIGKILL for any still there after `STOP_GRACE_SECONDS`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

PREFIX = "modelswap-bench-"
OWNER_FILE = ".modelswap-bench-owner"
#: how long a stale directory's processes get to stop on SIGTERM (a node stops its Triton)
STOP_GRACE_SECONDS = 15.0


def start_ticks(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat field 22);
    None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: count after it
    return stat.rsplit(")", 1)[1].split()[19]


def owner_record() -> str:
    pid = os.getpid()
    return f"{pid} {start_ticks(pid)}"


def owner_gone(record: str) -> bool:
    """True only for a well-formed record of a process that no longer runs: a record that
    does not parse (half written, another tool's) never makes a directory stale."""
    match record.split():
        case [pid, ticks] if pid.isdigit() and ticks.isdigit():
            return start_ticks(int(pid)) != ticks
        case _:
            return False


def processes_in(directory: Path) -> list[int]:
    """The pids (this one's aside) whose command line names a path inside `directory`."""
    needle = os.fsencode(directory) + b"/"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(arg.startswith(needle) or b"=" + needle in arg for arg in argv):
            found.append(int(entry.name))
    return found


def stop_processes_in(directory: Path) -> list[int]:
    """SIGTERM every process running from `directory`, SIGKILL what is left after
    STOP_GRACE_SECONDS; the pids signalled."""
    pids = processes_in(directory)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while (left := processes_in(directory)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def sweep(parent: Path) -> list[Path]:
    """Remove the bench directories in `parent` whose recorded owner is gone, after
    stopping what still runs from them; those removed."""
    removed = []
    for entry in sorted(parent.glob(f"{PREFIX}*")):
        try:
            record = (entry / OWNER_FILE).read_text()
        except (OSError, UnicodeDecodeError):  # no directory, no record, or not a record
            continue
        if owner_gone(record):
            stopped = stop_processes_in(entry)
            if stopped:
                print(
                    f"stopped {len(stopped)} process(es) left running in {entry}", file=sys.stderr
                )
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


@contextlib.contextmanager
def directory(prefix: str, parent: str | Path | None = None) -> Iterator[Path]:
    """A new directory `<parent>/<prefix>XXXXXXXX` (parent: the system's temporary
    directory), owned by this process and removed after; stale ones beside it go first.
    `prefix` starts with PREFIX."""
    if not prefix.startswith(PREFIX):
        raise ValueError(f"a bench directory's prefix starts with {PREFIX!r}: {prefix!r}")
    where = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    for gone in sweep(where):
        print(f"removed {gone}: left by a bench that was killed", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix=prefix, dir=where) as tmp:
        written = Path(tmp) / f"{OWNER_FILE}.tmp"  # whole or absent to a sweep beside us
        written.write_text(owner_record())
        written.rename(Path(tmp) / OWNER_FILE)
        yield Path(tmp)


def _unwind(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def unwind_on_signals() -> None:
    """SIGTERM/SIGINT unwind the bench through every `finally` (its node's group stopped,
    its directories removed); a second signal is ignored so it cannot cut that cleanup
    short."""
    signal.signal(signal.SIGTERM, _unwind)
    signal.signal(signal.SIGINT, _unwind)
