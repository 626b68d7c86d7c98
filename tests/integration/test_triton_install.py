"""What `make setup` installed for Triton: the stubs' environment and the installer's
idempotence (tools/install_triton.py)."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.support.triton_server import ROOT, tritonserver_binary

VENV = ROOT / ".venv-triton"


def stub_python(code: str) -> subprocess.CompletedProcess[str]:
    tritonserver_binary()  # fails loudly when the install is missing
    return subprocess.run([str(VENV / "bin" / "python"), "-c", code], check=False,
                          capture_output=True,
                          text=True, timeout=60, cwd="/")  # fmt: skip


def test_stubs_import_numpy_below_2_the_client_library_and_wire_only() -> None:
    ok = stub_python(
        "import numpy, modelswap_client.client, modelswap_api.wire;"
        "assert numpy.__version__.startswith('1.'), numpy.__version__"
    )
    assert ok.returncode == 0, ok.stderr
    # The rest of the contract (and its dependencies) is not there: only wire.
    refused = stub_python("import modelswap_api.models")
    assert refused.returncode != 0 and "ModuleNotFoundError" in refused.stderr
    assert stub_python("import modelswap_sidecar").returncode != 0


def test_the_installer_is_quick_and_changes_nothing_when_already_done() -> None:
    launcher = VENV / "bin" / "tritonserver"
    before = (launcher.stat().st_mtime_ns, (VENV / "tritonserver").stat().st_mtime_ns)
    started = time.monotonic()
    subprocess.run([sys.executable, str(ROOT / "tools" / "install_triton.py"), "--venv", str(VENV)],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    assert time.monotonic() - started < 10.0
    assert (launcher.stat().st_mtime_ns, (VENV / "tritonserver").stat().st_mtime_ns) == before
