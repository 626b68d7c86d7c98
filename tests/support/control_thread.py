"""The agent's control API served as the agent serves it, in a thread of its own, for
synchronous tests (hypothesis): `with ControlThread(folder, token) as control: control.url`."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from modelswap_sidecar.control.app import make_app, start
from modelswap_sidecar.control.auth import TokenFile
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings
from tests.support.memory_backend import InMemoryBackend


class ControlThread:
    """The control API as the agent serves it (`start`), over the in-memory backend, on its
    own event loop in a thread; `url`."""

    def __init__(self, folder: Path, token: str) -> None:
        token_file = folder / "token"
        token_file.write_text(token + "\n")
        self.settings = ControlSettings(
            node_name="node-1",
            token_file=token_file,
            state_file=folder / "revision.json",
            host="127.0.0.1",
            port=0,
            unload_check_interval_seconds=3600,
        )
        self._token = TokenFile(token_file)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.url = ""

    def __enter__(self) -> ControlThread:
        self._thread.start()

        async def serve() -> Any:
            backend = InMemoryBackend("node-1", {"gpu-0": 1 << 40})
            service = ControlService(backend, self.settings, clock=time.time)
            return await start(make_app(service, self._token))

        self._runner = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)
        port = next(a[1] for a in self._runner.addresses if isinstance(a, tuple))
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *_: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
