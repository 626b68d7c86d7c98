"""The client library runs in Triton's python-backend stubs, under the Triton container's
system Python (3.10 in the Ubuntu 22.04 based releases, 3.12 in the Ubuntu 24.04 based
ones; docs/operations.md has the table), not under ours (3.11+). So `modelswap_client` and
the `modelswap_api.wire` it imports must work on Python 3.10-3.13: their source parses
with 3.10's grammar, and they import and talk the protocol under every interpreter of
those versions this machine has (standard library only, isolated mode)."""

from __future__ import annotations

import ast
import glob
import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "client"
API = ROOT / "api"
SMOKE = ROOT / "tests" / "support" / "client_smoke.py"


def stub_sources() -> list[Path]:
    files = sorted((CLIENT / "modelswap_client").rglob("*.py"))
    return [*files, API / "modelswap_api" / "wire.py", API / "modelswap_api" / "__init__.py"]


def test_the_sources_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in stub_sources()}
    assert "client/modelswap_client/client.py" in names
    assert "client/modelswap_client/mappers/sim.py" in names
    assert "api/modelswap_api/wire.py" in names


@pytest.mark.parametrize("path", stub_sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_source_parses_with_the_python_3_10_grammar(path: Path) -> None:
    # feature_version refuses syntax newer than 3.10 (except*, PEP 695 generics, ...).
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))


def test_api_package_init_imports_nothing() -> None:
    """Importing modelswap_api.wire runs modelswap_api/__init__.py first: it must stay free
    of imports, or the stubs' Python would need our dependencies."""
    tree = ast.parse((API / "modelswap_api" / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


# Standard-library names that 3.10 lacks (module -> names), checked where no 3.10 runs.
NEWER_THAN_3_10 = {
    "enum": {"StrEnum", "ReprEnum", "verify", "member", "nonmember", "global_enum"},
    "typing": {"Self", "LiteralString", "Never", "assert_never", "reveal_type", "TypeVarTuple"},
    "datetime": {"UTC"},
    "asyncio": {"TaskGroup", "timeout", "timeout_at", "Runner"},
    "hashlib": {"file_digest"},
    "contextlib": {"chdir"},
    "operator": {"call"},
    "logging": {"getLevelNamesMapping"},
}
NEW_MODULES = {"tomllib", "wsgiref.types"}


def _runtime_uses_of_newer_stdlib(tree: ast.Module) -> list[str]:
    """3.11+ names used at run time: not in annotations (postponed by `from __future__
    import annotations`) and not inside an `if sys.version_info ...` block."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        hidden: list[ast.AST] = []
        if isinstance(node, ast.If) and "version_info" in ast.unparse(node.test):
            hidden = [*node.body, *node.orelse]
        elif isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            hidden = [node.annotation]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            hidden = [node.returns]
        skipped.update(id(n) for h in hidden for n in ast.walk(h))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name in NEW_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in NEW_MODULES:
                found.append(node.module)
            newer = NEWER_THAN_3_10.get(node.module, set())
            found += [f"{node.module}.{a.name}" for a in node.names if a.name in newer]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.attr in NEWER_THAN_3_10.get(node.value.id, set())
        ):
            found.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
    return found


@pytest.mark.parametrize("path", stub_sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_source_uses_no_standard_library_name_newer_than_3_10(path: Path) -> None:
    assert _runtime_uses_of_newer_stdlib(ast.parse(path.read_text())) == []


def test_the_newer_name_check_sees_a_bare_strenum() -> None:
    bare = ast.parse("import enum\nclass Op(enum.StrEnum):\n    A = 'a'\n")
    assert _runtime_uses_of_newer_stdlib(bare) == ["enum.StrEnum (line 2)"]
    guarded = ast.parse(
        "import enum, sys\nif sys.version_info >= (3, 11):\n    S = enum.StrEnum\n"
        "def f(x: 'typing.Self') -> typing.Self: ...\n"
    )
    assert _runtime_uses_of_newer_stdlib(guarded) == []


def _candidates(version: str) -> list[str]:
    found = [shutil.which(f"python{version}")]
    pyenv_root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    found += sorted(glob.glob(f"{pyenv_root}/versions/{version}.*/bin/python{version}"))
    found += [f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    uv = shutil.which("uv")
    if uv:
        result = subprocess.run(
            [uv, "python", "find", "--no-project", version],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        found.append(result.stdout.strip() or None)
    return [c for c in dict.fromkeys(found) if c and os.access(c, os.X_OK)]


@cache
def interpreter(version: str) -> str | None:
    """A working python<version>: a pyenv shim on PATH may exist and still refuse to run."""
    want = [int(part) for part in version.split(".")]
    for candidate in _candidates(version):
        try:
            result = subprocess.run(
                [candidate, "-I", "-c", "import sys; print(list(sys.version_info[:2]))"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except OSError:
            continue
        if result.returncode == 0 and json.loads(result.stdout) == want:
            return candidate
    return None


@pytest.mark.parametrize("version", ["3.10", "3.12", "3.13"])
def test_client_imports_and_talks_under(version: str) -> None:
    """3.10: Triton 24.xx stubs (the oldest Python the client supports); 3.12: 25.xx."""
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no python{version} interpreter on this machine (PATH, pyenv, uv)")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [python, "-I", "-B", str(SMOKE), str(CLIENT), str(API)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["python"] == [int(part) for part in version.split(".")]
    assert seen["modules"] >= 10  # every module of the client was imported
    assert seen["reply"] == {"epoch": 3, "saw_bytes": 4096}  # the fd arrived
    assert seen["error"] == "Stale|Stale: epoch 2 is gone"
    # str() and f-strings give the wire value, as enum.StrEnum does on 3.11+
    assert seen["formatted"] == ["swap_in", "NoCapacity", "hbm"]
