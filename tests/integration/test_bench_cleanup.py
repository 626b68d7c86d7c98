"""`bench.swap` interrupted mid-run leaves nothing behind: no work dir, no client process."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NO_FILE = ["--no-results"]


def _read_line(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "bench said nothing in time"
    line = proc.stdout.readline()
    assert line, f"bench exited early ({proc.poll()})"
    return line.strip()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_bench_removes_its_dir_and_children(sig: signal.Signals) -> None:
    bench = subprocess.Popen(
        # tiny and long: it is still swapping when the signal comes; writes no results
        [sys.executable, "-m", "bench.swap", "--sizes-mib", "32", "--reps", "100000", *NO_FILE],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    workdir: Path | None = None
    client_pid = 0
    try:
        first = _read_line(bench)
        assert first.startswith("workdir "), first
        workdir = Path(first.split(" ", 1)[1])
        started = _read_line(bench)  # the client attached: the swap loop is running
        assert started.startswith("started 32 MiB: client pid "), started
        client_pid = int(started.rsplit(" ", 1)[1])
        assert workdir.is_dir() and _alive(client_pid)
        bench.send_signal(sig)
        assert bench.wait(timeout=30) == 128 + sig
        assert not workdir.exists()
        assert not _alive(client_pid)  # killed and reaped by the bench
    finally:
        for pid in (bench.pid, client_pid):
            if pid and _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        bench.wait(timeout=10)
        if bench.stdout is not None:
            bench.stdout.close()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
