"""Client identity: the runtime driver vouches for the process that registers a model.

For Triton the driver vouches for a descendant of the agent's Triton whose stub command
line names the model (`triton.stubs.TritonVoucher`). Local mode's dev loop (`modelswap up
--dev`, docs/LOCAL.md "Developing a model outside Triton") adds a `DevVoucher`: a process
of the agent's own uid, outside Triton, may act for a model the local folder declares a
dev model (the names are in `DevModels`' file, written by local mode before it pushes the
set). `AnyVoucher` asks each in turn. Tests register their own processes with
`RegisteredVoucher`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

PROC = Path("/proc")
#: The dev-models file is written by local mode and names a few models: a larger one is
#: refused (read as no dev models) instead of being read into the agent.
MAX_DEV_MODELS_FILE_BYTES = 1 << 20


class Voucher(Protocol):
    def vouch(self, pid: int, model: str) -> bool:
        """True when process `pid` may act for `model`."""
        ...


class RegisteredVoucher:
    """Vouches for exactly the (pid, model) pairs registered with it."""

    def __init__(self) -> None:
        self._pairs: set[tuple[int, str]] = set()
        self._lock = threading.Lock()

    def register(self, pid: int, model: str) -> None:
        with self._lock:
            self._pairs.add((pid, model))

    def unregister(self, pid: int, model: str) -> None:
        with self._lock:
            self._pairs.discard((pid, model))

    def vouch(self, pid: int, model: str) -> bool:
        with self._lock:
            return (pid, model) in self._pairs


class AnyVoucher:
    """Vouches when any of `vouchers` does (asked in order, the first yes wins)."""

    def __init__(self, vouchers: Sequence[Voucher]) -> None:
        self.vouchers = tuple(vouchers)

    def vouch(self, pid: int, model: str) -> bool:
        return any(v.vouch(pid, model) for v in self.vouchers)


class DevModels:
    """The engine names of local mode's dev models, read from `path` on every call (a
    register or a load: rare), so an edit of the local folder takes effect at once.

    The file is JSON, `{"models": ["m-<hex>", ...]}`, written whole (renamed over) by local
    mode. A missing, unreadable, oversized or malformed file names no dev model: the dev
    loop then vouches for nobody, which is the safe side."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def names(self) -> frozenset[str]:
        try:
            with self.path.open("rb") as f:
                raw = f.read(MAX_DEV_MODELS_FILE_BYTES + 1)
        except FileNotFoundError:
            return frozenset()
        except OSError as e:
            log.warning("dev models file %s: cannot read it: %s", self.path, e)
            return frozenset()
        if len(raw) > MAX_DEV_MODELS_FILE_BYTES:
            log.warning(
                "dev models file %s: over %d bytes; no dev model is vouched for",
                self.path,
                MAX_DEV_MODELS_FILE_BYTES,
            )
            return frozenset()
        try:
            doc = json.loads(raw)
            models = doc["models"]
            if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
                raise TypeError("models: expected a list of strings")
        except (ValueError, KeyError, TypeError) as e:
            log.warning("dev models file %s: malformed (%s); no dev model", self.path, e)
            return frozenset()
        return frozenset(models)


def process_uids(pid: int, *, proc: Path = PROC) -> tuple[int, int] | None:
    """(real, effective) uid of process `pid` from /proc/<pid>/status; None when it is
    gone or unreadable."""
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) >= 3 and fields[1].isdigit() and fields[2].isdigit():
                return int(fields[1]), int(fields[2])
    return None


class DevVoucher:
    """Local mode's dev loop: vouches for process `pid` as `model` when `model` is one of
    the dev models, the process's real and effective uid are `uid` (the agent's own), and
    `excluded(pid)` is False (the assembly excludes the processes of the agent's Triton,
    so a Triton model's stub cannot act for a dev model).

    That is no wider than the trust the dev loop needs: a process of the developer's uid
    can already read the run directory (the control API's token included). A dev model is
    never loaded into Triton, so nothing but such a process can act for it."""

    def __init__(
        self,
        dev_models: Callable[[], frozenset[str]],
        *,
        uid: int,
        excluded: Callable[[int], bool] = lambda pid: False,
        proc: Path = PROC,
    ) -> None:
        self._dev_models = dev_models
        self._uid = uid
        self._excluded = excluded
        self._proc = proc

    def vouch(self, pid: int, model: str) -> bool:
        if model not in self._dev_models():
            return False
        uids = process_uids(pid, proc=self._proc)
        if uids is None or uids != (self._uid, self._uid):
            log.info(
                "not vouching for pid %d as dev model %r: its uids %s are not the agent's %d",
                pid,
                model,
                uids,
                self._uid,
            )
            return False
        if self._excluded(pid):
            log.info("not vouching for pid %d as dev model %r: a Triton process", pid, model)
            return False
        return True
