"""`TritonVoucher.kill` / `stubs.kill_stub` (issue 26, item 6): the agent ends a process
that answers nothing only while it is a stub of that model under the current Triton; a
stopped process is killed (SIGKILL ends a stopped process too); anything else is left
alone, and a pid that is gone says so. The "stub" here is a real process whose command
line reads like one (`exec -a triton_python_backend_stub`), a child of this test, which
plays Triton."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelswap_sidecar.triton.stubs import KillOutcome, TritonVoucher, kill_stub, process_state
from tests.support.waiting import wait_for

MODEL = "m-0123456789abcdef0123456789abcdef"


@pytest.fixture
def fake_stub(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line is `triton_python_backend_stub <repo>/<MODEL>/1/model.py`."""
    script = tmp_path / "repository" / MODEL / "1" / "model.py"
    script.parent.mkdir(parents=True)
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen(
        ["bash", "-c", f'exec -a triton_python_backend_stub "{sys.executable}" "{script}"'],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_a_stopped_stub_of_the_model_is_killed(fake_stub: subprocess.Popen[bytes]) -> None:
    os.kill(fake_stub.pid, signal.SIGSTOP)
    wait_for(lambda: process_state(fake_stub.pid) == "T", 10, "the stub stopped")
    voucher = TritonVoucher(os.getpid)
    assert voucher.kill(fake_stub.pid, MODEL) is KillOutcome.KILLED
    assert fake_stub.wait(10) == -signal.SIGKILL
    assert process_state(fake_stub.pid) == ""  # reaped: gone
    assert voucher.kill(fake_stub.pid, MODEL) is KillOutcome.GONE


def test_a_process_that_is_not_that_models_stub_is_left_alone(
    fake_stub: subprocess.Popen[bytes],
) -> None:
    other_model = "m-ffffffffffffffffffffffffffffffff"
    assert kill_stub(os.getpid(), fake_stub.pid, other_model) is KillOutcome.NOT_A_STUB
    assert kill_stub(None, fake_stub.pid, MODEL) is KillOutcome.NOT_A_STUB  # no Triton
    sibling = subprocess.Popen(["sleep", "60"])  # a Triton the stub does not descend from
    try:
        assert kill_stub(sibling.pid, fake_stub.pid, MODEL) is KillOutcome.NOT_A_STUB
    finally:
        sibling.kill()
        sibling.wait(10)
    # the test process itself: not a stub by its command line
    assert kill_stub(os.getppid(), os.getpid(), MODEL) is KillOutcome.NOT_A_STUB
    # a voucher that maps no Triton name for the model
    assert TritonVoucher(os.getpid, lambda _: None).kill(fake_stub.pid, MODEL) is (
        KillOutcome.NOT_A_STUB
    )
    assert fake_stub.poll() is None
    assert process_state(fake_stub.pid) in ("S", "R")
