"""The client-protocol server: a `SOCK_SEQPACKET` Unix socket, one `Peer` per client,
within the connection limits of `EngineSettings`."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import resource
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from modelswap_api.wire import Peer, PeerLimits
from modelswap_sidecar.engine.core import Engine

log = logging.getLogger(__name__)
PR_SET_DUMPABLE = 4


def harden_process() -> None:
    """`PR_SET_DUMPABLE 0` (no core dumps, no ptrace by same-uid peers) and the soft fd
    limit raised to the hard one (chunks travel as fds)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed: errno %d", ctypes.get_errno())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass(slots=True, eq=False)  # one per connection: compared by identity
class _Connection:
    peer: Peer
    pid: int
    register_by: float  # monotonic seconds: closed then unless registered


class EngineServer:
    """Accepts clients, within `EngineSettings`' limits: `max_connections` in all and
    `max_connections_per_process` from one pid (more are closed when accepted, with a log
    line naming the limit); each connection's requests on at most
    `max_handlers_per_connection` threads with `max_waiting_requests_per_connection` more
    waiting (`wire.PeerLimits`); and a connection that has not registered within
    `register_timeout_seconds` is closed (a watcher thread). So connections that are not
    model processes hold a bounded number of the agent's threads and fds."""

    def __init__(self, engine: Engine, path: Path, mode: int = 0o660) -> None:
        self.engine = engine
        self.path = path
        settings = engine.settings
        self._max_connections = settings.max_connections
        self._max_per_process = settings.max_connections_per_process
        self._register_timeout_seconds = settings.register_timeout_seconds
        self._limits = PeerLimits(
            settings.max_handlers_per_connection,
            settings.max_waiting_requests_per_connection,
            ("max_handlers_per_connection", "max_waiting_requests_per_connection"),
        )
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._sock.bind(str(path))
        os.chmod(path, mode)
        self._sock.listen(64)
        self._closed = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._connections: dict[int, _Connection] = {}  # by id(peer)
        self._unregistered: list[_Connection] = []  # oldest first
        self._refused = 0
        self._refusal_logged_at = -math.inf
        self._thread = threading.Thread(target=self._accept, name="engine-accept", daemon=True)
        self._watcher = threading.Thread(
            target=self._watch_registrations, name="engine-register-deadline", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        self._watcher.start()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._connections)

    def _accept(self) -> None:
        n = 0
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed:
                    return
                continue
            n += 1
            try:
                self._serve(conn, f"client-{n}")
            except Exception as e:  # one connection's failure never stops the accepting
                log.error("client-%d: closed: %s", n, e)
                conn.close()

    def _serve(self, conn: socket.socket, name: str) -> None:
        pid, uid = peer_credentials(conn)
        refusal = self._admit(pid)
        if refusal is not None:
            self._log_refusal(pid, uid, refusal)
            conn.close()
            return
        peer = Peer(conn, self.engine.handle, self._gone, name=name, limits=self._limits)
        c = _Connection(peer, pid, time.monotonic() + self._register_timeout_seconds)
        with self._lock:
            self._connections[id(peer)] = c
            self._unregistered.append(c)
        try:
            peer.start()
        except BaseException:
            peer.close()  # counted out again by `_gone`
            raise

    def _admit(self, pid: int) -> str | None:
        """Why a new connection from `pid` is refused, or None."""
        with self._lock:
            if len(self._connections) >= self._max_connections:
                return f"{len(self._connections)} connections open (max_connections)"
            mine = sum(1 for c in self._connections.values() if c.pid == pid)
            if mine >= self._max_per_process:
                return f"{mine} connections open from it (max_connections_per_process)"
        return None

    def _log_refusal(self, pid: int, uid: int, why: str) -> None:
        """At most one line a second, with the count since the last: a flood of connects
        must not flood the log."""
        self._refused += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= 1.0:
            log.warning(
                "refused a connection from pid %d uid %d: %s (%d refused since the last line)",
                pid,
                uid,
                why,
                self._refused,
            )
            self._refusal_logged_at = now
            self._refused = 0

    def _gone(self, peer: Peer) -> None:
        with self._lock:
            c = self._connections.pop(id(peer), None)
            if c is not None and c in self._unregistered:
                self._unregistered.remove(c)
        self.engine.client_gone(peer)

    def _watch_registrations(self) -> None:
        step_seconds = min(max(self._register_timeout_seconds / 4, 0.05), 1.0)
        while not self._stop.wait(step_seconds):
            now = time.monotonic()
            late: list[_Connection] = []
            with self._lock:
                waiting: list[_Connection] = []
                for c in self._unregistered:
                    if self.engine.registered(c.peer):
                        continue  # registered: no deadline any more
                    (late if now >= c.register_by else waiting).append(c)
                self._unregistered = waiting
            for c in late:
                log.info(
                    "%s (pid %d): closed, not registered within %g s (register_timeout_seconds)",
                    c.peer.name,
                    c.pid,
                    self._register_timeout_seconds,
                )
                c.peer.close()

    def close(self) -> None:
        self._closed = True
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)
        self._watcher.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the connected process, from `SO_PEERCRED`."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return int(pid), int(uid)
