"""The run directory of `modelswap up` and the state file `modelswap status` reads.

    <run dir>/                        (default ./.modelswap)
      local.json        who runs, where: pid, gateway and control URLs, token file,
                        Triton's shm prefix, the models served and the files refused
      token             the control API's bearer token (0600)
      dev-models.json   --dev: the engine names of the dev models (the agent's voucher
                        reads it)
      agent.yaml        the agent's settings
      supervisor.json   the supervisor's state (children's pids, restarts)
      agent-state/      the agent's state (agent.json: its ports)
      sock/             the agent's client socket
      store/            the host store (a link to a folder in /dev/shm when the run dir
                        is on disk: local/up.py)
      repository/       Triton's model repository
      source-cache/     fetched sources, kept between runs; the four above are not

Writes are atomic (a temporary file renamed over), so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "local.json"


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / STATE_FILE

    @property
    def token_file(self) -> Path:
        return self.root / "token"

    @property
    def agent_settings(self) -> Path:
        return self.root / "agent.yaml"

    @property
    def supervisor_state(self) -> Path:
        return self.root / "supervisor.json"

    @property
    def dev_models_file(self) -> Path:
        return self.root / "dev-models.json"

    @property
    def agent_state(self) -> Path:
        return self.root / "agent-state"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    @property
    def host_store(self) -> Path:
        return self.root / "store"

    @property
    def repository(self) -> Path:
        return self.root / "repository"

    @property
    def source_cache(self) -> Path:
        return self.root / "source-cache"

    #: What one run owns and the next run starts without (a fresh node each time).
    def transient(self) -> tuple[Path, ...]:
        return (self.agent_state, self.socket_dir, self.host_store, self.repository)

    def write_token(self) -> str:
        token = secrets.token_urlsafe(32)
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token)
        return token


def write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
