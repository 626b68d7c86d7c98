"""Bench scratch directories: owned, removed after, and the ones a killed bench left are
removed by the next bench while nothing else is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench import scratch


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _left(parent: Path, name: str, record: str | None) -> Path:
    entry = parent / name
    (entry / "run").mkdir(parents=True)
    (entry / "run" / "host-store.bin").write_bytes(b"x" * 4096)
    if record is not None:
        (entry / scratch.OWNER_FILE).write_text(record)
    return entry


def test_a_directory_is_owned_while_open_and_gone_after(tmp_path: Path) -> None:
    with scratch.directory("modelswap-bench-t-", tmp_path) as work:
        assert work.parent == tmp_path and work.name.startswith("modelswap-bench-t-")
        assert not scratch.owner_gone((work / scratch.OWNER_FILE).read_text())
    assert not work.exists()


def test_what_a_killed_bench_left_is_removed_and_nothing_else(tmp_path: Path) -> None:
    me = scratch.owner_record()
    dead = _left(tmp_path, "modelswap-bench-gw-dead", f"{_dead_pid()} 1")
    reused = _left(tmp_path, "modelswap-bench-gw-reused", f"{os.getpid()} 1")  # pid reused
    live = _left(tmp_path, "modelswap-bench-gw-live", me)
    unowned = _left(tmp_path, "modelswap-bench-gw-unowned", None)
    other = _left(tmp_path, "someone-else", f"{_dead_pid()} 1")
    with scratch.directory("modelswap-bench-gw-", tmp_path):
        assert not dead.exists() and not reused.exists()
        assert live.exists() and unowned.exists() and other.exists()


def test_the_prefix_must_be_a_bench_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="modelswap-bench-"), scratch.directory("x-", tmp_path):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_live_process_has_a_start_time_and_a_gone_one_none() -> None:
    assert scratch.start_ticks(os.getpid()) is not None
    assert scratch.start_ticks(_dead_pid()) is None


def _running_in(directory: Path, *, ignore_term: bool) -> subprocess.Popen[str]:
    """A process whose command line names a file in `directory`, as a bench's node does."""
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(300)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, f"--model-repository={directory}/run/repository"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_a_killed_bench_s_processes_are_stopped_before_its_directory_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scratch, "STOP_GRACE_SECONDS", 0.5)
    dead = _left(tmp_path, "modelswap-bench-gw-dead", f"{_dead_pid()} 1")
    live = _left(tmp_path, "modelswap-bench-gw-live", scratch.owner_record())
    polite = _running_in(dead, ignore_term=False)
    stubborn = _running_in(dead, ignore_term=True)
    bystander = _running_in(live, ignore_term=False)
    try:
        assert sorted(scratch.processes_in(dead)) == sorted([polite.pid, stubborn.pid])
        with scratch.directory("modelswap-bench-gw-", tmp_path):
            assert polite.wait(timeout=10) == -signal.SIGTERM
            assert stubborn.wait(timeout=10) == -signal.SIGKILL  # after the grace
            assert not dead.exists() and live.exists()
            assert bystander.poll() is None  # a live bench's process is left alone
    finally:
        for proc in (polite, stubborn, bystander):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("record", [b"", b"12", b"x y", b"1 2 3", b"\xff\xfe 1"])
def test_a_record_that_does_not_parse_leaves_its_directory_alone(
    tmp_path: Path, record: bytes
) -> None:
    odd = tmp_path / "modelswap-bench-odd"
    odd.mkdir()
    (odd / scratch.OWNER_FILE).write_bytes(record)  # half written by a bench beside us, or junk
    (tmp_path / "modelswap-bench-a-file").write_text("not a directory")
    with scratch.directory("modelswap-bench-gw-", tmp_path):
        assert odd.exists() and (tmp_path / "modelswap-bench-a-file").exists()
