"""The state gate: an attachment's client state machine and the in-use gate in front of it.

`enter`/`leave` bracket the model's own work (`Attachment.in_use`); a swap-out waits for
them to drain (`drain`), and a lost agent cancels a drain (`connection_lost`) so the
model goes back to serving. One condition variable guards it all; nothing here does I/O.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from modelswap_api.wire import ErrorCode, StrEnum
from modelswap_client.errors import ClientError


class ClientState(StrEnum):
    DETACHED = "detached"
    RESIDENT = "resident"
    DRAINING = "draining"
    QUIESCED = "quiesced"
    SWAPPED_OUT = "swapped_out"
    MAPPED = "mapped"  # swap-in: mapped, not yet restored
    REMOVED = "removed"  # the model was deleted: nothing mapped, never again


class StateGate:
    """The client state, how many callers are inside `in_use()`, and the swap-out drain."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._cond = threading.Condition()
        self._state = ClientState.DETACHED
        self._in_use = 0
        #: the drain in progress (DRAINING, QUIESCED): while set, nobody enters
        self._drain_token: object | None = None
        #: bumped by every lost connection: a drain started before it is cancelled
        self._generation = 0
        self._closed = False

    @property
    def state(self) -> ClientState:
        with self._cond:
            return self._state

    @property
    def ended(self) -> bool:
        """Closed by its owner, or the model was removed: nothing reconnects any more."""
        with self._cond:
            return self._closed or self._state is ClientState.REMOVED

    def set(self, state: ClientState) -> None:
        with self._cond:
            self._state = state
            if state is not ClientState.DRAINING and state is not ClientState.QUIESCED:
                self._drain_token = None
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True

    # -- the model's side -----------------------------------------------------------------

    def enter(self, deadline: float, swap_in: Callable[[float], None]) -> None:
        """Count the caller in once the model is resident and no drain is pending. When it
        is swapped out, `swap_in(deadline)` asks for it (called without the lock held).

        Raises `ClientError(REMOVED)` for a removed model, `TimeoutError` at `deadline`
        (`time.monotonic()`)."""
        with self._cond:
            while True:
                if self._state is ClientState.REMOVED:
                    raise ClientError(f"{self._model} was removed", ErrorCode.REMOVED)
                if self._state is ClientState.RESIDENT and self._drain_token is None:
                    self._in_use += 1
                    return
                if self._state is ClientState.SWAPPED_OUT:
                    self._cond.release()
                    try:
                        swap_in(deadline)
                    finally:
                        self._cond.acquire()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self._model}: not resident within the deadline")
                self._cond.wait(remaining)

    def leave(self) -> None:
        with self._cond:
            self._in_use -= 1
            self._cond.notify_all()

    # -- the agent's side -----------------------------------------------------------------

    def drain(self) -> object:
        """RESIDENT → DRAINING, then wait until every caller left `in_use()`. Returns the
        drain's token (for `quiesced`). Raises `ClientError(WRONG_STATE)` when not
        resident, `ClientError(STALE)` when the drain was cancelled meanwhile (the agent
        resumed the model, or the connection was lost)."""
        token = object()
        with self._cond:
            if self._state is not ClientState.RESIDENT:
                raise ClientError(f"cannot quiesce in state {self._state}", ErrorCode.WRONG_STATE)
            generation = self._generation
            self._drain_token = token
            self._state = ClientState.DRAINING
            self._cond.wait_for(
                lambda: (
                    self._in_use == 0
                    or self._drain_token is not token
                    or self._generation != generation
                )
            )
            if self._drain_token is not token or self._generation != generation:
                raise ClientError("swap-out was cancelled", ErrorCode.STALE)
        return token

    def quiesced(self, token: object) -> None:
        """The drain `token` finished (swap-out handlers ran): QUIESCED, still closed to
        callers until the agent unmaps or resumes."""
        with self._cond:
            self.set(ClientState.QUIESCED)
            self._drain_token = token

    def resume(self) -> None:
        """A swap-out the agent called off: a drained model serves again."""
        with self._cond:
            if self._state in (ClientState.DRAINING, ClientState.QUIESCED):
                self.set(ClientState.RESIDENT)

    def connection_lost(self) -> None:
        """The agent went away: cancel a drain in progress."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
