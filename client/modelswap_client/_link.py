"""The agent link: the model process's connection to the agent — connect and register,
requests that wait out an agent restart, heartbeats, and after a restart reconnect with
back-off, roll back and readopt (through the agent handler)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from modelswap_api.wire import ConnectionLost, Message, Op, Peer, RemoteError
from modelswap_client._facts import AgentFacts
from modelswap_client._gate import StateGate
from modelswap_client._handler import AgentHandler
from modelswap_client._hooks import Hooks
from modelswap_client.errors import ClientError
from modelswap_client.mappers.base import MapperError

log = logging.getLogger(__name__)


class AgentLink:
    """One `Peer` at a time over the agent's `SOCK_SEQPACKET` socket; the agent's own
    requests on it go to `handler.handle`."""

    def __init__(
        self,
        socket_path: str,
        model: str,
        instance: str,
        *,
        handler: AgentHandler,
        gate: StateGate,
        facts: AgentFacts,
        hooks: Hooks,
        timeout_seconds: float,
        reconnect_timeout_seconds: float,
        heartbeat_interval_seconds: float,
    ) -> None:
        self._socket_path = socket_path
        self._model = model
        self._instance = instance
        self._handler = handler
        self._gate = gate
        self._facts = facts
        self._hooks = hooks
        self._timeout_seconds = timeout_seconds
        self._reconnect_timeout_seconds = reconnect_timeout_seconds
        self._heartbeat_interval_seconds = heartbeat_interval_seconds
        self._lock = threading.Lock()
        self._peer: Peer | None = None
        #: set while `_peer` is registered (and readopted): requests wait for it
        self._connected = threading.Event()
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        #: what each heartbeat reports beside being alive (`Attachment.report_kv`)
        self.kv_report: Callable[[], dict[str, int]] | None = None

    def open(self) -> None:
        """Connect and register, then start the heartbeats. Raises `ClientError` when the
        agent refuses the registration, `OSError` when it cannot be reached."""
        try:
            peer = self._connect()
        except RemoteError as e:
            raise ClientError(f"{self._model}: registration refused: {e.message}", e.code) from e
        with self._lock:
            self._peer = peer
        self._connected.set()
        if self._heartbeat_interval_seconds > 0 and self._heartbeat_thread is None:
            self._heartbeat_thread = threading.Thread(
                target=self._heartbeats, name="modelswap-heartbeat", daemon=True
            )
            self._heartbeat_thread.start()

    def request(self, op: Op, body: dict[str, Any], deadline: float | None = None) -> Message:
        """Send a request; across an agent restart, wait for the reconnect and retry.
        Raises `ClientError` when the agent refuses, `TimeoutError` at `deadline`
        (`time.monotonic()`; default: `timeout_seconds` from now)."""
        deadline = deadline or time.monotonic() + self._timeout_seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._connected.wait(remaining):
                raise TimeoutError(f"{self._model}: agent not reachable")
            peer = self._peer
            if peer is None:
                continue
            try:
                return peer.request(
                    op,
                    body,
                    self._facts.epoch,
                    timeout_seconds=max(deadline - time.monotonic(), 0.001),
                )
            except ConnectionLost:
                continue
            except RemoteError as e:
                raise ClientError(f"{self._model}: {op} refused: {e.message}", e.code) from e

    def close(self) -> None:
        """Stop the heartbeats and close the connection. Call `gate.close()` first, so the
        closed connection is not taken for a lost agent."""
        self._heartbeat_stop.set()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=self._heartbeat_interval_seconds + 1)
        peer = self._peer
        if peer is not None:
            peer.close()

    def _connect(self) -> Peer:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(self._socket_path)
        except OSError:
            sock.close()
            raise
        peer = Peer(sock, self._handler.handle, self._lost, name=f"{self._model}/{self._instance}")
        peer.start()
        # Whatever ends the registration early (refused, timed out, lost, a mapper that
        # cannot take the agent's facts) closes this connection: the agent would otherwise
        # hold an unregistered connection, and this process a reader thread, until exit.
        hello = {"model": self._model, "instance": self._instance, "pid": os.getpid()}
        try:
            reply = peer.request(
                Op.REGISTER, {**hello, "version": 1}, timeout_seconds=self._timeout_seconds
            )
            self._facts.advance(reply.epoch)
            self._handler.registered(reply.body)
        except MapperError as e:
            peer.close()
            raise ClientError(f"{self._model}: {e}") from e
        except BaseException:
            peer.close()
            raise
        return peer

    def _heartbeats(self) -> None:
        """Tell the agent this process is alive, every `heartbeat_interval_seconds`.

        The agent records the last one per client (status) and logs a silent one; one
        silent past its `policy.unresponsiveAfterSeconds` answers nothing (this thread runs
        beside any work in `in_use()`), and the agent kills a Triton stub so silent. A send
        that fails (the agent restarting) is simply skipped; a removed model sends none.
        """
        interval = self._heartbeat_interval_seconds
        while not self._heartbeat_stop.wait(interval) and not self._gate.ended:
            peer = self._peer
            if peer is None or not self._connected.is_set():
                continue
            try:
                peer.request(
                    Op.HEARTBEAT, self._beat(), self._facts.epoch, timeout_seconds=interval
                )
            except (ConnectionLost, RemoteError, TimeoutError) as e:
                log.debug("%s: heartbeat not answered: %s", self._model, e)

    def _beat(self) -> dict[str, Any]:
        """A heartbeat's body: the KV report where the model gave one (its counters
        reach the agent's metrics this way); a report that fails is left out."""
        report = self.kv_report
        if report is None:
            return {}
        try:
            return {"kv": report()}
        except Exception as e:  # the heartbeat matters more than the figures
            log.warning("%s: the KV report failed: %s", self._model, e)
            return {}

    # -- agent loss and readopt ------------------------------------------------------------

    def _lost(self, peer: Peer) -> None:
        with self._lock:
            if peer is not self._peer:
                return
            self._connected.clear()
        self._gate.connection_lost()
        if self._gate.ended:
            return
        threading.Thread(target=self._recover, name="modelswap-reconnect", daemon=True).start()

    def _recover(self) -> None:
        self._handler.roll_back()
        deadline = time.monotonic() + self._reconnect_timeout_seconds
        delay = 0.02
        while not self._gate.ended and time.monotonic() < deadline:
            try:
                peer = self._connect()
            except (OSError, ConnectionLost, RemoteError, TimeoutError, ClientError):
                time.sleep(delay)  # the agent is restarting: retry with back-off
                delay = min(delay * 2, 0.5)
                continue
            try:
                self._handler.readopt(peer, self._timeout_seconds)
            except (ConnectionLost, RemoteError, TimeoutError) as e:
                log.warning("%s: readopt failed: %s", self._model, e)
                peer.close()
                continue
            with self._lock:
                self._peer = peer
            self._connected.set()
            Hooks.run(self._hooks.readopt)
            return
        log.error(
            "%s: agent did not come back within %s s",
            self._model,
            self._reconnect_timeout_seconds,
        )
