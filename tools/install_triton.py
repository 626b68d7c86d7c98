"""Install a real `tritonserver` (CPU) into its own virtualenv, `.venv-triton` (DESIGN.md §8).

The `nvidia-pytriton` wheel ships Triton 2.51, its python backend and one python-backend
stub per Python version. It pins numpy<2, so it lives in a virtualenv of its own; that
virtualenv is also the environment of every python-backend stub process.

What this writes (all under the virtualenv, which git ignores):

- `tritonserver/`: the wheel's `tritonserver` folder without the per-version stubs, and
  `backends/python/triton_python_backend_stub` for this virtualenv's Python.
- `bin/tritonserver`: a launcher. It puts the Python's shared-library folder and the wheel's
  `nvidia_pytriton.libs` on `LD_LIBRARY_PATH`, and the virtualenv's `bin` first on `PATH`
  (a stub embeds Python, which finds its prefix by looking for `python3` on `PATH`: that is
  how the stubs get this virtualenv's site-packages), and passes `--backend-directory` and
  `--cache-directory`; every other option is the caller's.
- `stub-path/`: what the stubs may import of ours, and nothing else: `modelswap_client`
  (a symlink to the repository's package) and `modelswap_api/wire.py` (a symlink; the
  `modelswap_api/__init__.py` beside it is empty, so no other module of the contract is
  importable there). A `modelswap-stub-path.pth` in site-packages adds this folder.
  Symlinks, so edits in the repository are seen by the next stub without reinstalling.

Idempotent: a stamp records what was installed; when it matches, only the launcher, the
stub path and the `.pth` are checked (and rewritten if they differ), which takes well under
a second. Usage:

    python tools/install_triton.py [--python python3.11] [--venv .venv-triton]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PYTRITON_VERSION = "0.7.0"
#: Bump when what this script writes changes, so existing installs are redone.
LAYOUT_VERSION = 1
STAMP_NAME = ".installed.json"
REPO_ROOT = Path(__file__).resolve().parents[1]


def _say(message: str) -> None:
    print(f"install_triton: {message}", flush=True)


def _fail(message: str) -> SystemExit:
    return SystemExit(f"install_triton: {message}")


def _venv_facts(venv: Path) -> dict[str, str]:
    """Ask the virtualenv's Python where things are (it may differ from the running one)."""
    code = (
        "import json, sys, sysconfig;"
        "print(json.dumps({'version': '%d.%d' % sys.version_info[:2],"
        " 'full_version': sys.version.split()[0],"
        " 'purelib': sysconfig.get_path('purelib'),"
        " 'libdir': sysconfig.get_config_var('LIBDIR') or '',"
        " 'ldlibrary': sysconfig.get_config_var('LDLIBRARY') or '',"
        " 'shared': str(sysconfig.get_config_var('Py_ENABLE_SHARED'))}))"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], check=True, capture_output=True, text=True
    )
    facts: dict[str, str] = json.loads(out.stdout)
    return facts


def _write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    if path.is_file() and not path.is_symlink() and path.read_text() == text:
        if path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)
    return True


def _symlink(link: Path, target: Path) -> None:
    """Point `link` at `target` with a relative symlink, replacing whatever is there."""
    relative = os.path.relpath(target, link.parent)
    if link.is_symlink() and os.readlink(link) == relative:
        return
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    elif link.exists() or link.is_symlink():
        link.unlink()
    link.symlink_to(relative)


def _launcher_text(python_version: str, python_libdir: str) -> str:
    return f"""#!/bin/sh
# Written by tools/install_triton.py: runs the tritonserver from nvidia-pytriton {PYTRITON_VERSION}.
# The stubs embed Python {python_libdir}; with this virtualenv's bin first on PATH they use its
# site-packages (numpy<2, and modelswap_client + modelswap_api.wire through stub-path/).
venv=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
libs="{python_libdir}:$venv/lib/python{python_version}/site-packages/nvidia_pytriton.libs"
export LD_LIBRARY_PATH="$libs${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
export PATH="$venv/bin:$PATH"
exec "$venv/tritonserver/bin/tritonserver" \\
    --backend-directory="$venv/tritonserver/backends" \\
    --cache-directory="$venv/tritonserver/caches" "$@"
"""


def _install_server(venv: Path, facts: dict[str, str]) -> None:
    wheel_root = Path(facts["purelib"]) / "pytriton" / "tritonserver"
    if not (wheel_root / "bin" / "tritonserver").is_file():
        raise _fail(f"{wheel_root} has no bin/tritonserver: is nvidia-pytriton installed?")
    stub = wheel_root / "python_backend_stubs" / facts["version"] / "triton_python_backend_stub"
    if not stub.is_file():
        raise _fail(f"nvidia-pytriton {PYTRITON_VERSION} has no stub for Python {facts['version']}")
    target = venv / "tritonserver"
    staging = venv / "tritonserver.new"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(
        wheel_root,
        staging,
        symlinks=True,
        ignore=shutil.ignore_patterns("python_backend_stubs", "__pycache__"),
    )
    shutil.copy2(stub, staging / "backends" / "python" / "triton_python_backend_stub")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def _install_stub_path(venv: Path, facts: dict[str, str]) -> None:
    stub_path = venv / "stub-path"
    api = stub_path / "modelswap_api"
    api.mkdir(parents=True, exist_ok=True)
    _symlink(stub_path / "modelswap_client", REPO_ROOT / "client" / "modelswap_client")
    _write_if_changed(api / "__init__.py", "")
    _symlink(api / "wire.py", REPO_ROOT / "api" / "modelswap_api" / "wire.py")
    for extra in api.iterdir():
        if extra.name not in {"__init__.py", "wire.py", "__pycache__"}:
            raise _fail(f"{extra} should not be there: stub-path exposes only wire.py of the api")
    _write_if_changed(Path(facts["purelib"]) / "modelswap-stub-path.pth", f"{stub_path}\n")


def _check(venv: Path, facts: dict[str, str]) -> None:
    """Fail loudly now rather than when Triton first starts a stub."""
    launcher = venv / "bin" / "tritonserver"
    libs = f"{facts['libdir']}:{facts['purelib']}/nvidia_pytriton.libs"
    env = {**os.environ, "LD_LIBRARY_PATH": libs}
    binaries = (
        venv / "tritonserver" / "bin" / "tritonserver",
        venv / "tritonserver" / "backends" / "python" / "triton_python_backend_stub",
    )
    if shutil.which("ldd"):
        for binary in binaries:
            out = subprocess.run(
                ["ldd", str(binary)], check=False, env=env, capture_output=True, text=True
            )
            missing = [line.strip() for line in out.stdout.splitlines() if "not found" in line]
            if missing:
                raise _fail(f"{binary} cannot find {missing}")
    probe = "import numpy, modelswap_client, modelswap_api.wire; assert numpy.__version__ < '2'"
    subprocess.run([str(venv / "bin" / "python"), "-c", probe], check=True)
    if not os.access(launcher, os.X_OK):
        raise _fail(f"{launcher} is not executable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="python3.11", help="interpreter for the virtualenv")
    parser.add_argument("--venv", default=str(REPO_ROOT / ".venv-triton"), type=Path)
    args = parser.parse_args(argv)
    venv: Path = args.venv.resolve()
    started = time.monotonic()

    if not (venv / "bin" / "python").exists():
        _say(f"creating {venv}")
        subprocess.run([args.python, "-m", "venv", str(venv)], check=True)
    facts = _venv_facts(venv)
    if facts["shared"] != "1" or not facts["libdir"]:
        raise _fail(f"{args.python} is not built with a shared libpython; the stub needs one")
    wanted = {
        "pytriton": PYTRITON_VERSION,
        "python": facts["full_version"],
        "layout": LAYOUT_VERSION,
    }
    stamp = venv / STAMP_NAME
    try:
        installed = json.loads(stamp.read_text())
    except (OSError, ValueError):
        installed = None
    server_present = (venv / "tritonserver" / "bin" / "tritonserver").is_file()
    if installed != wanted or not server_present:
        stamp.unlink(missing_ok=True)
        _say(f"installing nvidia-pytriton=={PYTRITON_VERSION} into {venv}")
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, f"nvidia-pytriton=={PYTRITON_VERSION}"], check=True)
        _install_server(venv, facts)
    launcher = _launcher_text(facts["version"], facts["libdir"])
    _write_if_changed(venv / "bin" / "tritonserver", launcher, mode=0o755)
    _install_stub_path(venv, facts)
    _check(venv, facts)
    if installed != wanted or not server_present:
        stamp.write_text(json.dumps(wanted) + "\n")
        _say(f"done in {time.monotonic() - started:.1f} s: {venv / 'bin' / 'tritonserver'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
