"""`make demo` end to end: tools/demo.py exits 0 with every answer of the real example
models (embed, tinyllama) equal to plain transformers', idle swap-outs, request-triggered
swap-ins, one swap-in for a burst on a cold model, and nothing left running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.triton_server import tritonserver_binary

ROOT = Path(__file__).resolve().parents[2]
LIMIT_SECONDS = 180


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_demo_passes_with_every_answer_correct_and_nothing_left() -> None:
    tritonserver_binary()
    demo = subprocess.Popen(
        [sys.executable, str(ROOT / "tools" / "demo.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        # README and docs/LOCAL.md promise under 3 minutes
        out, err = demo.communicate(timeout=LIMIT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(demo.pid, signal.SIGINT)  # the demo stops local mode as on its own failure
        try:
            out, err = demo.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            out, err = demo.communicate()
        pytest.fail(f"the demo took more than {LIMIT_SECONDS} s:\n{out[-4000:]}{err[-2000:]}")
    assert demo.returncode == 0, out[-4000:] + err[-2000:]
    match = re.search(r"correctness: (\d+)/(\d+) responses correct", out)
    assert match is not None, out
    assert match.group(1) == match.group(2) and int(match.group(1)) > 50
    assert "left running: nothing" in out
    assert "burst on cold embed: 1 swap-in(s) for 50 requests" in out
    for model in ("embed", "tinyllama"):
        assert f"{model} swapped out when idle" in out
    # each model's row: swap-ins (its request-triggered ones), swap-outs, ..., phase
    rows = {m.group(1): m for m in re.finditer(r"^(embed|tinyllama) +(\d+) +(\d+) ", out, re.M)}
    assert set(rows) == {"embed", "tinyllama"}, out
    assert int(rows["embed"].group(2)) >= 2 and int(rows["tinyllama"].group(2)) >= 1, out
