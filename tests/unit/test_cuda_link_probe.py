"""The link probe: the child's measurement on the fake CUDA, and the parent's process handling."""

from __future__ import annotations

import json
import sys
import time

import pytest

from modelswap_client import cuda_compat as cc
from modelswap_sidecar.gpu import link_probe
from modelswap_sidecar.gpu.link_probe import LinkProbeError, classify, probe_link
from tests.support.fake_cuda.api import install
from tests.support.fake_cuda.world import MIB, FakeCuda


@pytest.mark.parametrize("major", [12, 13])
def test_child_measures_pinned_copies_and_cleans_up(
    monkeypatch: pytest.MonkeyPatch, major: int
) -> None:
    fake = install(monkeypatch, FakeCuda(major=major, total_bytes=64 * MIB))
    fake.bandwidth_bytes_per_s = 25e9  # the fake's copy engine
    b = cc.load()
    cc.initialize(b)
    result = link_probe.measure(b, 0, 8 * MIB, repeats=3)
    assert result["h2d_gbps"] == pytest.approx(25.0, rel=0.01)
    assert result["d2h_gbps"] == pytest.approx(25.0, rel=0.01)
    assert result["uuid"].startswith("GPU-a0")
    copies = fake.calls_named("cuMemcpyHtoDAsync")
    assert len(copies) == 4 and all(c.args[2] == 8 * MIB for c in copies), "warm-up + 3 timed"
    assert fake.unpinned_copies == 0, "copies come from pinned host memory"
    assert fake.host_buffers == {} and fake.streams == set() and fake.events == {}
    assert fake.used_bytes(0) == 0 and fake.contexts == {0: 0}


def test_classification() -> None:
    assert classify(53.1, host_page_tables=False) == "pcie"
    assert classify(53.1, host_page_tables=True) == "c2c"  # ATS: Grace NVLink-C2C
    assert classify(360.0, host_page_tables=False) == "c2c"


def test_parent_parses_the_child_line() -> None:
    line = json.dumps({
        "uuid": "GPU-1", "h2d_gbps": 371.2, "d2h_gbps": 297.0, "host_page_tables": True,
        "size_bytes": 1024, "repeats": 5,
    })  # fmt: skip
    probe = probe_link("GPU-1", command=[sys.executable, "-c", f"print({line!r})"])
    assert (probe.kind, probe.h2d_gbps, probe.d2h_gbps) == ("c2c", 371.2, 297.0)
    assert link_probe.as_status(probe) == {
        "kind": "c2c", "h2dGBps": 371.2, "d2hGBps": 297.0, "probeBytes": 1024
    }  # fmt: skip


def test_parent_reports_a_child_without_cuda() -> None:
    body = "import json,sys; print(json.dumps({'error': 'no CUDA driver'})); sys.exit(3)"
    with pytest.raises(LinkProbeError, match="no CUDA driver"):
        probe_link(0, command=[sys.executable, "-c", body])


def test_parent_kills_a_hung_child_as_a_group(tmp_path: object) -> None:
    pid_file = f"{tmp_path}/pid"
    body = (
        "import os,subprocess,sys,time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({pid_file!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    with pytest.raises(LinkProbeError, match="timed out"):
        probe_link(0, timeout_seconds=1.5, command=[sys.executable, "-c", body])
    with open(pid_file) as f:
        grandchild = int(f.read())
    deadline = time.monotonic() + 10
    while not _dead(grandchild):  # SIGKILL is delivered at once; reaping may lag a moment
        assert time.monotonic() < deadline, "the probe's grandchild survived the group kill"
        time.sleep(0.01)


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
