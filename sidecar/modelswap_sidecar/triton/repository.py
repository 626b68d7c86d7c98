"""The model repository the agent's Triton serves: one symlink per loaded model.

Triton is started with `--model-repository=<root>` and explicit model control. A model is
made visible as `<root>/<triton name>` → its model directory (a mounted source or a
source-cache entry), so the stub's command line names the Triton model name (what the
voucher checks) and two models from different namespaces never share a directory name.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from modelswap_sidecar.triton.naming import is_triton_model_name

log = logging.getLogger(__name__)


class ModelRepository:
    def __init__(self, root: Path) -> None:
        self.root = root

    def create(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def path_of(self, name: str) -> Path:
        if not is_triton_model_name(name):
            raise ValueError(f"not a modelswap Triton model name: {name!r}")
        return self.root / name

    def link(self, name: str, model_dir: Path) -> Path:
        """Point `<root>/<name>` at `model_dir` (atomically replacing an older link)."""
        target = model_dir.resolve()
        if not target.is_dir():
            raise FileNotFoundError(f"model directory {model_dir} does not exist")
        path = self.path_of(name)
        tmp = self.root / f".{name}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, path)
        log.debug("repository: %s -> %s", name, target)
        return path

    def unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path_of(name).unlink()

    def names(self) -> list[str]:
        """The Triton model names linked here."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if is_triton_model_name(p.name))
