"""The client-protocol server: a `SOCK_SEQPACKET` Unix socket, one `Peer` per client."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
import socket
import threading
from pathlib import Path

from modelswap_api.wire import Peer
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


class EngineServer:
    def __init__(self, engine: Engine, path: Path, mode: int = 0o660) -> None:
        self.engine = engine
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._sock.bind(str(path))
        os.chmod(path, mode)
        self._sock.listen(64)
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="engine-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

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
            peer = Peer(conn, self.engine.handle, self.engine.client_gone, name=f"client-{n}")
            peer.start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
