"""A minimal agent settings document (`settings_from_document`), for tests of how the agent
reads its settings: one sim GPU, every required path under `root` (nothing is created)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def settings_document(
    root: Path = Path("/tmp"), *, gpu_capacity: str = "128Mi", **extra: Any
) -> dict[str, Any]:
    """The document, with `extra` keys replacing or adding top-level sections."""
    return {
        "nodeName": "node-a",
        "gpus": [{"uuid": "sim-gpu-0", "capacityBytes": gpu_capacity}],
        "hostStore": {"dir": str(root / "store")},
        "socketDir": str(root / "sock"),
        "stateDir": str(root / "state"),
        "sourceCache": {"dir": str(root / "cache")},
        "control": {"tokenFile": str(root / "token")},
        "triton": {"url": "127.0.0.1:8000", "repository": str(root / "repo")},
        **extra,
    }
