"""`make demo` end to end: tools/demo.py exits 0, every answer correct, nothing left."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.triton_server import tritonserver_binary

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_demo_passes_with_every_answer_correct_and_nothing_left() -> None:
    tritonserver_binary()
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=ROOT,
        start_new_session=True,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    match = re.search(r"correctness: (\d+)/(\d+) responses correct", out)
    assert match is not None, out
    assert match.group(1) == match.group(2) and int(match.group(1)) > 50
    assert "left running: nothing" in out
    assert "burst on cold classify: 1 swap-in(s) for 50 requests" in out
