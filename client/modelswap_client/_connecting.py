"""The connection to the agent: requests with retry across a reconnect, heartbeats, and
recovery after the agent restarts (local rollback of unfinished operations, then readopt:
every mapped chunk is re-exported to the new agent)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from modelswap_api.wire import ConnectionLost, Message, Op, Peer, RemoteError
from modelswap_client._state import ClientState
from modelswap_client._swapping import Swapping
from modelswap_client.errors import ClientError

log = logging.getLogger(__name__)


class Connecting(Swapping):
    """Talks to the agent; answers it through `Swapping._handle`."""

    def _start_heartbeats(self) -> None:
        if self.heartbeat_interval_seconds > 0 and self._heartbeat_thread is None:
            self._heartbeat_thread = threading.Thread(
                target=self._heartbeats, name="modelswap-heartbeat", daemon=True
            )
            self._heartbeat_thread.start()

    def _heartbeats(self) -> None:
        """Tell the agent this process is alive, every `heartbeat_interval_seconds`.

        The agent records the last one per client (status) and logs a silent one; the
        socket closing, not a missed heartbeat, is what ends a client. A send that fails
        (the agent restarting) is simply skipped.
        """
        interval = self.heartbeat_interval_seconds
        while not self._heartbeat_stop.wait(interval):
            peer = self._peer
            if peer is None or not self._connected.is_set():
                continue
            try:
                peer.request(Op.HEARTBEAT, {}, self.epoch, timeout_seconds=interval)
            except (ConnectionLost, RemoteError, TimeoutError) as e:
                log.debug("%s: heartbeat not answered: %s", self.model, e)

    def _request(self, op: Op, body: dict[str, Any], deadline: float | None = None) -> Message:
        """Send a request; across an agent restart, wait for the reconnect and retry."""
        deadline = deadline or time.monotonic() + self.timeout_seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._connected.wait(remaining):
                raise TimeoutError(f"{self.model}: agent not reachable")
            peer = self._peer
            if peer is None:
                continue
            try:
                return peer.request(
                    op, body, self.epoch, timeout_seconds=max(deadline - time.monotonic(), 0.001)
                )
            except ConnectionLost:
                continue
            except RemoteError as e:
                raise ClientError(f"{self.model}: {op} refused: {e.message}", e.code) from e

    def _connect(self) -> Peer:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        peer = Peer(sock, self._handle, self._lost, name=f"{self.model}/{self.instance}")
        peer.start()
        reply = peer.request(
            Op.REGISTER,
            {"model": self.model, "instance": self.instance, "pid": os.getpid(), "version": 1},
            timeout_seconds=self.timeout_seconds,
        )
        self.epoch = max(self.epoch, reply.epoch)
        return peer

    # -- agent loss and readopt ------------------------------------------------------------

    def _lost(self, peer: Peer) -> None:
        with self._cond:
            if peer is not self._peer:
                return
            self._connected.clear()
            self._generation += 1
            self._cond.notify_all()
            if self._closing:
                return
        threading.Thread(target=self._recover, name="modelswap-reconnect", daemon=True).start()

    def _recover(self) -> None:
        with self._op_lock:  # waits for handlers still running for the dead agent
            with self._cond:
                state = self._state
            if state in (ClientState.DRAINING, ClientState.QUIESCED):
                self._set_state(ClientState.RESIDENT)  # the swap-out never finished: resume
            elif state is ClientState.MAPPED:
                self.mapper.synchronize()
                self._unmap_all()  # the restore never finished: back to swapped out
                self._set_state(ClientState.SWAPPED_OUT)
        deadline = time.monotonic() + self.reconnect_timeout_seconds
        delay = 0.02
        while not self._closing and time.monotonic() < deadline:
            try:
                peer = self._connect()
            except (OSError, ConnectionLost, RemoteError, TimeoutError):
                time.sleep(delay)  # the agent is restarting: retry with back-off
                delay = min(delay * 2, 0.5)
                continue
            try:
                self._readopt(peer)
            except (ConnectionLost, RemoteError, TimeoutError) as e:
                log.warning("%s: readopt failed: %s", self.model, e)
                peer.close()
                continue
            for h in self._on_readopt:
                h(self)
            return
        log.error(
            "%s: agent did not come back within %s s", self.model, self.reconnect_timeout_seconds
        )

    def _readopt(self, peer: Peer) -> None:
        with self._op_lock:
            state = self.state
            fds: list[int] = []
            regions = []
            mapped = state in (ClientState.RESIDENT,)
            for r in self.regions.values():
                chunks = []
                if mapped:
                    for offset, size, h in r.handles:
                        chunks.append({"offset": offset, "bytes": size, "fd": len(fds)})
                        fds.append(self.mapper.export_fd(h))
                regions.append(
                    {
                        "tag": r.tag,
                        "bytes": r.reserved_bytes,
                        "kind": str(r.kind),
                        "address": r.address,
                        "chunks": chunks,
                    }
                )
            wire_state = "resident" if mapped else "swapped_out"
            try:
                reply = peer.request(
                    Op.READOPT,
                    {"state": wire_state, "regions": regions},
                    self.epoch,
                    fds,
                    timeout_seconds=self.timeout_seconds,
                )
            finally:
                for fd in fds:
                    os.close(fd)
            with self._cond:
                self.epoch = max(self.epoch, reply.epoch)
                self.committed = bool(reply.body.get("committed", self.committed))
                self._peer = peer
                self._connected.set()
                self._cond.notify_all()
