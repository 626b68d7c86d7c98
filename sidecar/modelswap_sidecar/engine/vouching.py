"""Client identity: the runtime driver vouches for the process that registers a model.

For Triton the driver vouches for a descendant of the agent's Triton whose stub command
line names the model. Tests register their own processes with `RegisteredVoucher`.
"""

from __future__ import annotations

import threading
from typing import Protocol


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
