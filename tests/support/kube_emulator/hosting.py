"""Running the emulator beside a test: in a thread with its own event loop (for blocking
clients and `kopf.testing.KopfRunner`), or as a subprocess in its own process group.

Both write a kubeconfig (removed on exit) and are ready when the context manager returns.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from tests.support.kube_emulator.audit import RequestRecord
from tests.support.kube_emulator.server import KubeEmulator, kubeconfig

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[3]


class _Kubeconfig:
    """A private temp folder holding `kubeconfig`, removed with everything in it on close."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="kube-emulator-")
        self.dir = Path(self._dir.name)
        self.path = self.dir / "kubeconfig"

    def close(self) -> None:
        self._dir.cleanup()


class _HoldsKubeconfig:
    """What both ways of hosting hand a test: the kubeconfig file and a private home."""

    _files: _Kubeconfig | None = None

    @property
    def kubeconfig_path(self) -> Path:
        assert self._files is not None
        return self._files.path

    @property
    def home(self) -> Path:
        """A private folder for tools' caches (kubectl's discovery cache)."""
        assert self._files is not None
        return self._files.dir


class EmulatorThread(_HoldsKubeconfig):
    """`with EmulatorThread(manifests=[crd_path]) as api:` → `api.url`, `api.kubeconfig_path`,
    `api.emulator` (touch its state only through `api.call`). Keyword arguments other than
    `manifests` go to `KubeEmulator` (`tls=True`: HTTPS, authentication, RBAC, admission
    policies; then `token_for`, `write_kubeconfig_for`, `request_log`)."""

    def __init__(self, *, manifests: Sequence[Path] = (), **kwargs: Any) -> None:
        self._manifests = list(manifests)
        self._kwargs = kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.emulator: KubeEmulator | None = None
        self._files: _Kubeconfig | None = None

    def __enter__(self) -> EmulatorThread:
        self._thread.start()
        self.emulator = self.call(lambda: KubeEmulator(**self._kwargs))
        asyncio.run_coroutine_threadsafe(self.emulator.start(), self._loop).result(timeout=10)
        emulator = self.emulator
        self.call(lambda: emulator.load_manifests(self._manifests))
        self._files = _Kubeconfig()
        self.emulator.write_kubeconfig(self._files.path)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self.emulator is not None:
                asyncio.run_coroutine_threadsafe(self.emulator.stop(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
            if self._files is not None:
                self._files.close()

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the emulator's loop (the cluster state is only touched there)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as e:
                future.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        return future.result(timeout=10)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create one object (any served kind) directly, for seeding a test's cluster."""
        emulator = self.emulator
        assert emulator is not None
        return self.call(lambda: emulator.create_object(obj))

    @property
    def url(self) -> str:
        assert self.emulator is not None
        return self.emulator.url

    @property
    def token(self) -> str:
        assert self.emulator is not None
        return self.emulator.token

    @property
    def ca_pem(self) -> bytes | None:
        assert self.emulator is not None
        return self.emulator.ca_pem

    def token_for(self, namespace: str, service_account: str, node_name: str | None = None) -> str:
        """See `KubeEmulator.token_for` (the ServiceAccount must exist)."""
        emulator = self.emulator
        assert emulator is not None
        return self.call(lambda: emulator.token_for(namespace, service_account, node_name))

    def write_kubeconfig_for(
        self, namespace: str, service_account: str, node_name: str | None = None
    ) -> Path:
        """A kubeconfig (beside the admin one, removed on exit) authenticating as that
        ServiceAccount, named `kubeconfig-<ns>-<sa>[-<node>]`."""
        assert self._files is not None and self.emulator is not None
        token = self.token_for(namespace, service_account, node_name)
        suffix = f"-{node_name}" if node_name else ""
        path = self._files.dir / f"kubeconfig-{namespace}-{service_account}{suffix}"
        return self.emulator.write_kubeconfig(path, namespace, token)

    def request_log(self) -> list[RequestRecord]:
        emulator = self.emulator
        assert emulator is not None
        return self.call(emulator.request_log)

    def clear_request_log(self) -> None:
        emulator = self.emulator
        assert emulator is not None
        self.call(emulator.clear_request_log)


class EmulatorProcess(_HoldsKubeconfig):
    """`with EmulatorProcess(manifests=[crd_path]) as api:` → a subprocess emulator, in its
    own process group, killed (group) on exit; `api.kubeconfig_path` for other processes.
    `tls=True` as for `KubeEmulator`; tokens for ServiceAccounts then come from
    `POST /emulator/tokens` (see `KubeEmulator._mint_over_http`)."""

    def __init__(
        self,
        *,
        manifests: Sequence[Path] = (),
        start_timeout_s: float = 10.0,
        extra_args: list[str] | None = None,
        tls: bool = False,
    ) -> None:
        self._start_timeout_s = start_timeout_s
        self._extra_args = [arg for m in manifests for arg in ("--manifest", str(m))]
        self._extra_args += ["--tls"] if tls else []
        self._extra_args += extra_args or []
        self.ca_pem: bytes | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._files: _Kubeconfig | None = None
        self.url = ""
        self.token = ""
        self.started_in_s = 0.0

    def __enter__(self) -> EmulatorProcess:
        self._files = _Kubeconfig()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        began = time.monotonic()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.kube_emulator", *self._extra_args],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            ready = self._read_ready_line()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.started_in_s = time.monotonic() - began
        self.url, self.token = ready["url"], ready["token"]
        if ready.get("ca"):
            self.ca_pem = base64.b64decode(ready["ca"])
        self._files.path.write_text(
            json.dumps(kubeconfig(self.url, self.token, ca_pem=self.ca_pem))
        )
        return self

    def _read_ready_line(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        result: list[bytes] = []
        reader = threading.Thread(target=lambda: result.append(self._proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(self._start_timeout_s)
        if not result or not result[0]:
            raise RuntimeError(f"the emulator did not start within {self._start_timeout_s}s")
        parsed: dict[str, Any] = json.loads(result[0])
        return parsed

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=10)
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._proc = None
        if self._files is not None:
            self._files.close()
            self._files = None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid
