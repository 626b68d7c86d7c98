"""The host store: agent-owned files in a memory-backed folder, plus a state file.

Layout under `root` (0700, owned by the agent):

    state.json                          the engine's records, rewritten atomically
    gpu<N>/<model>/<instance>/<tag>.<kind>       committed copies (0600)
    gpu<N>/<model>/<instance>/<tag>.<kind>.tmp   staging, being written

A copy is written into a staging file (the writer gets a writable fd), then `commit`
renames it into place; the engine rewrites the state file only after that, so the state
file never names bytes that are not all there. Clients get only read-only fds of committed
weight copies (`open_readonly`): a writable mapping of one fails. Staging files left by a
crash are removed at start, and so are copies the state file does not name (renamed into
place just before a crash, never recorded). Bytes are accounted per GPU against a
capacity; a staging file that would exceed it is refused with `HostStoreFull`.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelswap_sidecar.engine.errors import HostStoreFull

STATE_FILE = "state.json"


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A committed copy, by path relative to the store root."""

    gpu: int
    relpath: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Staging:
    gpu: int
    relpath: str  # final path, relative
    size_bytes: int
    fd: int  # writable; closed by `commit` or `abort`


def _safe(name: str) -> str:
    return urllib.parse.quote(name, safe="") or "_"


class HostStore:
    def __init__(self, root: Path, capacities_bytes: dict[int, int]) -> None:
        self.root = root
        self.capacities_bytes = dict(capacities_bytes)
        self._used: dict[int, int] = dict.fromkeys(capacities_bytes, 0)
        self._lock = threading.Lock()
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        for tmp in root.rglob("*.tmp"):  # a crash mid-write: never committed, never named
            tmp.unlink()

    # -- accounting ----------------------------------------------------------------------

    def used_bytes(self, gpu: int) -> int:
        with self._lock:
            return self._used.get(gpu, 0)

    def free_bytes(self, gpu: int) -> int:
        with self._lock:
            return self.capacities_bytes.get(gpu, 0) - self._used.get(gpu, 0)

    def _charge(self, gpu: int, size_bytes: int, what: str) -> None:
        with self._lock:
            if gpu not in self.capacities_bytes:
                raise HostStoreFull(f"host store has no capacity for GPU {gpu}")
            used = self._used[gpu]
            if used + size_bytes > self.capacities_bytes[gpu]:
                raise HostStoreFull(
                    f"host store for GPU {gpu} is full: {what} needs {size_bytes} bytes, "
                    f"{self.capacities_bytes[gpu] - used} of {self.capacities_bytes[gpu]} free"
                )
            self._used[gpu] = used + size_bytes

    def _credit(self, gpu: int, size_bytes: int) -> None:
        with self._lock:
            self._used[gpu] = max(self._used.get(gpu, 0) - size_bytes, 0)

    def adopt_existing(self, stored: StoredFile) -> bool:
        """Account a committed file named by the state file at start; False if it is gone."""
        path = self.root / stored.relpath
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return False
        if size != stored.size_bytes:
            return False
        with self._lock:
            self._used[stored.gpu] = self._used.get(stored.gpu, 0) + size
        return True

    def remove_unnamed(self, named: set[str]) -> list[str]:
        """Delete copies the state file does not name (a crash between a file's rename and
        the state file's rewrite leaves one); returns their relative paths."""
        removed = []
        for path in self.root.glob("gpu*/**/*"):
            rel = str(path.relative_to(self.root))
            if path.is_file() and rel not in named:
                path.unlink()
                removed.append(rel)
        return removed

    # -- files ---------------------------------------------------------------------------

    def relpath(self, gpu: int, model: str, instance: str, tag: str, kind: str) -> str:
        return f"gpu{gpu}/{_safe(model)}/{_safe(instance)}/{_safe(tag)}.{kind}"

    def stage(self, gpu: int, relpath: str, size_bytes: int) -> Staging:
        """A new writable staging file of `size_bytes` (charged now; freed by `abort`)."""
        self._charge(gpu, size_bytes, relpath)
        path = self.root / (relpath + ".tmp")
        try:
            for parent in reversed(path.relative_to(self.root).parents):
                d = self.root / parent
                if not d.exists():
                    d.mkdir(mode=0o700)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, size_bytes)
                os.posix_fallocate(fd, 0, size_bytes)
            except OSError:
                os.close(fd)
                path.unlink(missing_ok=True)
                raise
        except OSError as e:
            self._credit(gpu, size_bytes)
            raise HostStoreFull(f"cannot create {relpath} ({size_bytes} bytes): {e}") from e
        return Staging(gpu, relpath, size_bytes, fd)

    def commit(self, staging: Staging) -> StoredFile:
        """Close the staging fd and move the file into place (atomic rename)."""
        os.close(staging.fd)
        path = self.root / staging.relpath
        os.rename(str(path) + ".tmp", path)
        return StoredFile(staging.gpu, staging.relpath, staging.size_bytes)

    def commit_replacing(self, staging: Staging, old: StoredFile | None) -> StoredFile:
        """`commit`, replacing `old` (same path: the rename replaces it atomically, so a
        crash leaves one whole copy or the other); the old copy's bytes are credited."""
        stored = self.commit(staging)
        if old is not None:
            if old.relpath != stored.relpath:
                (self.root / old.relpath).unlink(missing_ok=True)
            self._credit(old.gpu, old.size_bytes)
        return stored

    def abort(self, staging: Staging) -> None:
        os.close(staging.fd)
        (self.root / (staging.relpath + ".tmp")).unlink(missing_ok=True)
        self._credit(staging.gpu, staging.size_bytes)

    def open_writable(self, stored: StoredFile) -> int:
        """For files a client may write (a KV pool's host tier), never for weight copies."""
        return os.open(self.root / stored.relpath, os.O_RDWR | os.O_CLOEXEC)

    def open_readonly(self, stored: StoredFile) -> int:
        return os.open(self.root / stored.relpath, os.O_RDONLY | os.O_CLOEXEC)

    def delete(self, stored: StoredFile) -> None:
        """Delete a committed copy and credit its bytes (also when the file is already gone:
        it was charged; callers forget the `StoredFile` afterwards)."""
        (self.root / stored.relpath).unlink(missing_ok=True)
        self._credit(stored.gpu, stored.size_bytes)

    # -- state file ----------------------------------------------------------------------

    def write_state(self, doc: dict[str, Any]) -> None:
        """Replace the state file atomically (write a temporary, then rename)."""
        tmp = self.root / (STATE_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.rename(tmp, self.root / STATE_FILE)

    def read_state(self) -> dict[str, Any] | None:
        try:
            with open(self.root / STATE_FILE) as f:
                doc: dict[str, Any] = json.load(f)
                return doc
        except FileNotFoundError:
            return None


#: filesystems whose pages the kernel lets a device pin for good (CUDA's cuMemHostRegister
#: of a host-store file): memory-backed ones. A regular disk filesystem's page cache cannot
#: be pinned long-term (the H200 run: CUDA_ERROR_INVALID_VALUE for a file on disk).
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "hugetlbfs"})


def filesystem_of(path: Path, mountinfo: str | None = None) -> str:
    """The type of the filesystem `path` lies on, from the mount table (the mount with the
    longest mount point above it); "" when it cannot be told."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return ""
    target = os.path.realpath(path)
    best, kind = "", ""
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        point = parts[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, rest.split()[0]
    return kind
