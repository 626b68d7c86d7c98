"""Builds the allocation shim (`_region_alloc.c`) into a shared library.

    python -m modelswap_client.native_build [--out-dir DIR] [--force]

The library's file name carries a digest of the source and the machine
(`_region_alloc-<digest>.so`), so a changed source or another architecture never loads a
stale build. It is written to the first writable folder of: `$MODELSWAP_NATIVE_DIR` (when
set), `_native/` next to the source (the checkout, an editable install; git ignores it
there; a folder without `__init__.py`, so nothing takes the library for a Python
extension module), the user's cache (`$XDG_CACHE_HOME/modelswap/native`, default
`~/.cache/modelswap/native`).
`modelswap_client.allocation` looks in the same folders and builds it on first use when it
is missing and a C compiler is present. Where the model process cannot build (no compiler,
read-only package, no home), build it where the package is installed, e.g. in the image
(`python -m modelswap_client.native_build`, or with `--out-dir DIR` and
`MODELSWAP_NATIVE_DIR=DIR` in the model process's environment).

The compiler is `$CC`, else the first of `cc`, `gcc`, `clang` on PATH, run as
`cc -O2 -fPIC -shared -pthread -o OUT _region_alloc.c`: plain C, no CUDA headers. The
output is written to a temporary name and renamed into place, so concurrent builders (two
model instances starting together) never load a half-written file.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from modelswap_client.errors import ClientError

SOURCE = Path(__file__).resolve().with_name("_region_alloc.c")
STEM = "_region_alloc"
COMPILERS = ("cc", "gcc", "clang")
FLAGS = ("-O2", "-fPIC", "-shared", "-pthread")
BUILD_TIMEOUT_SECONDS = 120.0
NATIVE_DIR_ENV = "MODELSWAP_NATIVE_DIR"


def library_name(source: Path = SOURCE) -> str:
    """`_region_alloc-<digest>.so`: the digest covers the source and the machine."""
    digest = hashlib.sha256(source.read_bytes())
    digest.update(f"\0{sys.platform}\0{platform.machine()}".encode())
    return f"{STEM}-{digest.hexdigest()[:16]}.so"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "modelswap" / "native"


def search_dirs() -> list[Path]:
    """Where a built library is looked for (and built), in order."""
    configured = os.environ.get(NATIVE_DIR_ENV)
    return [*([Path(configured)] if configured else []), SOURCE.parent / "_native", cache_dir()]


def find_library() -> Path | None:
    """The built library for the current source, if one exists."""
    name = library_name()
    for folder in search_dirs():
        candidate = folder / name
        if candidate.is_file():
            return candidate
    return None


def find_compiler() -> str | None:
    configured = os.environ.get("CC")
    if configured:
        return shutil.which(configured) or (configured if os.path.isfile(configured) else None)
    for name in COMPILERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def _writable_dir(candidates: list[Path]) -> Path | None:
    for folder in candidates:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK | os.X_OK):
            return folder
    return None


def build(out_dir: Path | None = None, *, force: bool = False) -> Path:
    """Compile the shim (unless a build of this source is there already and not `force`)
    and return the library's path. Raises `ClientError` naming what is missing."""
    if not SOURCE.is_file():
        raise ClientError(f"the allocation shim's source {SOURCE} is missing from the package")
    name = library_name()
    if out_dir is not None:
        folder: Path | None = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
    else:
        folder = _writable_dir(search_dirs())
    if folder is None:
        places = " or ".join(str(p) for p in search_dirs())
        raise ClientError(
            f"cannot build the allocation shim: neither {places} is writable; run "
            "`python -m modelswap_client.native_build --out-dir DIR` where the package is "
            "installed (e.g. in the image) with a writable folder among those"
        )
    target = folder / name
    if target.is_file() and not force:
        return target
    compiler = find_compiler()
    if compiler is None:
        raise ClientError(
            "the allocation shim (modelswap_client/_region_alloc.c) is not built and no C "
            f"compiler was found (looked for $CC, {', '.join(COMPILERS)} on PATH): install "
            "one (e.g. `apt-get install gcc`), or run `python -m modelswap_client.native_build` "
            "where one is, e.g. when building the image"
        )
    partial = folder / f".{name}.{os.getpid()}.partial"
    command = [compiler, *FLAGS, "-o", str(partial), str(SOURCE)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS, check=False
        )
        if done.returncode != 0:
            raise ClientError(
                f"building the allocation shim failed ({' '.join(command)} exited "
                f"{done.returncode}): {done.stderr.strip()[-2000:]}"
            )
        os.replace(partial, target)
    except subprocess.TimeoutExpired as e:
        raise ClientError(
            f"building the allocation shim took over {BUILD_TIMEOUT_SECONDS:.0f}s"
        ) from e
    finally:
        partial.unlink(missing_ok=True)
    return target


def ensure_library() -> Path:
    """The built library, built now if it is missing."""
    return find_library() or build()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m modelswap_client.native_build",
        description="Build the allocation shim of modelswap_client.allocation.",
    )
    parser.add_argument("--out-dir", type=Path, default=None, help="where to write the .so")
    parser.add_argument("--force", action="store_true", help="rebuild even if it exists")
    args = parser.parse_args(argv)
    try:
        path = build(args.out_dir, force=args.force)
    except ClientError as e:
        print(f"native_build: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
