"""Copy-event bookkeeping shared by the CUDA mappers (stdlib only; no CUDA calls here).

A `RecordedEvent` wraps one CUDA event recorded after a copy. It is finished once: the
first query, wait or mapper synchronize that sees it done keeps the error (if any) and
hands the CUDA event back to the mapper to destroy. Subclasses make the driver or runtime
calls (`_query`, `_synchronize`, `_release`); this class does the locking and polling.
"""

from __future__ import annotations

import abc
import threading
import time
from typing import Any

from modelswap_client.mappers.base import CopyError, CopyEvent


class RecordedEvent(CopyEvent):
    """A CUDA event recorded after one copy's pieces. Destroyed once it has been seen done."""

    def __init__(self, event: Any, what: str) -> None:
        self._event: Any | None = event
        self._what = what
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    @abc.abstractmethod
    def _query(self, event: Any) -> tuple[bool, BaseException | None]:
        """Ask without blocking: (done, the copy's error if done and failed)."""

    @abc.abstractmethod
    def _synchronize(self, event: Any) -> BaseException | None:
        """Block until done; the copy's error, if it failed."""

    @abc.abstractmethod
    def _release(self, event: Any) -> None:
        """Hand the finished CUDA event back to the mapper (which destroys it)."""

    def _finish(self, error: BaseException | None) -> None:
        """Called with `_lock` held, or by the mapper's synchronize."""
        if self._event is None:
            return
        self._error = error
        event, self._event = self._event, None
        self._release(event)

    def query(self) -> bool:
        with self._lock:
            if self._event is None:
                return True
            done, error = self._query(self._event)
            if not done:
                return False
            self._finish(error)
            return True

    def wait(self, timeout_seconds: float | None = None) -> None:
        if timeout_seconds is None:
            with self._lock:
                if self._event is not None:
                    self._finish(self._synchronize(self._event))
        else:
            deadline = time.monotonic() + timeout_seconds
            delay = 50e-6
            while not self.query():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self._what} still running after {timeout_seconds}s")
                time.sleep(min(delay, remaining))  # polling the GPU, not synchronizing tests
                delay = min(delay * 2, 5e-3)
        if self._error is not None:
            raise CopyError(f"{self._what} failed: {self._error}") from self._error
