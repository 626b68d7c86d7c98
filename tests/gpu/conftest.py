"""GPU tests: run on a machine with an NVIDIA GPU, Python 3.12, pytest, pytest-timeout,
cuda-bindings (13.x) and nvidia-ml-py — nothing else, and our package not installed.

    python -m pytest --confcutdir=tests/gpu -p no:cacheprovider tests/gpu

(`--confcutdir` keeps conftest files of the other test folders, which may need plugins
that GPU machines lack, out of this run.) This file puts the source folders on sys.path
and imports only the standard library and pytest; every test skips itself when no GPU or
no cuda-bindings is present.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for sub in ("api", "sidecar", "client", ""):
    path = str(ROOT / sub) if sub else str(ROOT)
    if path not in sys.path:
        sys.path.insert(0, path)


def _gpu_problem() -> str | None:
    try:
        from cuda.bindings import driver
    except ImportError as e:
        return f"cuda-bindings not installed ({e})"
    try:
        (err,) = driver.cuInit(0)
    except Exception as e:
        return f"no CUDA driver ({e})"
    if int(err) != 0:
        return f"cuInit failed ({err})"
    err, count = driver.cuDeviceGetCount()
    if int(err) != 0 or count < 1:
        return "no CUDA device"
    return None


_PROBLEM = _gpu_problem()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if Path(str(item.fspath)).resolve().parent != here:
            continue
        item.add_marker(pytest.mark.gpu)
        if _PROBLEM is not None:
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {_PROBLEM}"))


@pytest.fixture
def gpu_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment for child processes: the source folders on PYTHONPATH."""
    paths = [str(ROOT / "api"), str(ROOT / "sidecar"), str(ROOT / "client"), str(ROOT)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env
