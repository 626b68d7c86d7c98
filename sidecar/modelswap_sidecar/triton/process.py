"""A `tritonserver` process on loopback ports, in its own process group, and its cleanup.

Triton's python backend keeps one shared-memory region per stub in `/dev/shm`; a Triton
that dies without unloading its models leaves them behind. Every Triton started here gets
its own region prefix (`triton_python_backend_shm_region_ms<token>_`, passed with
`--backend-config=python,shm-region-prefix-name=...`), so cleanup removes exactly its own
regions and never those of another Triton on the machine.

`triton_command` builds the command line for callers that run the process themselves (the
node supervisor); `TritonProcess` runs it for local mode and tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from modelswap_sidecar.triton.errors import TritonStartFailed

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
#: Triton's own default prefix; ours extend it, so a sweep of this prefix finds ours too.
SHM_BASE_PREFIX = "triton_python_backend_shm_region_"
LOOPBACK = "127.0.0.1"
_POLL_SECONDS = 0.05
_LOG_TAIL_BYTES = 4000
_START_ATTEMPTS = 3


@dataclass(frozen=True)
class TritonPorts:
    http: int
    grpc: int
    #: None: metrics off (`--allow-metrics=false`).
    metrics: int | None = None


@dataclass(frozen=True)
class TritonSettings:
    """How to run one tritonserver."""

    binary: Path
    model_repository: Path
    host: str = LOOPBACK
    metrics: bool = False
    #: Seconds Triton waits for in-flight requests and unloads on SIGTERM.
    exit_timeout_seconds: int = 5
    log_verbose: int = 0
    #: Environment for the process (None: inherit ours).
    env: dict[str, str] | None = None
    extra_args: Sequence[str] = field(default_factory=tuple)


def free_loopback_port() -> int:
    """A TCP port free on loopback right now (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def pick_ports(*, metrics: bool) -> TritonPorts:
    http, grpc = free_loopback_port(), free_loopback_port()
    while grpc == http:
        grpc = free_loopback_port()
    metrics_port = None
    if metrics:
        metrics_port = free_loopback_port()
        while metrics_port in (http, grpc):
            metrics_port = free_loopback_port()
    return TritonPorts(http=http, grpc=grpc, metrics=metrics_port)


def new_shm_prefix() -> str:
    return f"{SHM_BASE_PREFIX}ms{secrets.token_hex(6)}_"


def triton_command(settings: TritonSettings, ports: TritonPorts, *, shm_prefix: str) -> list[str]:
    """The command line of one Triton: explicit model control, loopback ports, no GPU metrics."""
    command = [
        str(settings.binary),
        f"--model-repository={settings.model_repository}",
        "--model-control-mode=explicit",
        "--strict-readiness=true",
        "--allow-gpu-metrics=false",
        f"--http-address={settings.host}",
        f"--http-port={ports.http}",
        f"--grpc-address={settings.host}",
        f"--grpc-port={ports.grpc}",
        f"--exit-timeout-secs={settings.exit_timeout_seconds}",
        f"--log-verbose={settings.log_verbose}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
    ]
    if ports.metrics is None:
        command.append("--allow-metrics=false")
    else:
        command += [
            "--allow-metrics=true",
            f"--metrics-address={settings.host}",
            f"--metrics-port={ports.metrics}",
        ]
    command += list(settings.extra_args)
    return command


def shm_regions(prefix: str) -> list[Path]:
    """The shared-memory region files whose names start with `prefix`."""
    if not prefix.startswith(SHM_BASE_PREFIX) or "/" in prefix:
        raise ValueError(f"not a Triton shm region prefix: {prefix!r}")
    try:
        return sorted(p for p in SHM_DIR.iterdir() if p.name.startswith(prefix))
    except FileNotFoundError:
        return []


def remove_shm_regions(prefix: str) -> list[Path]:
    """Remove the regions of one Triton (by its prefix); returns what was removed."""
    removed = []
    for path in shm_regions(prefix):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    if removed:
        log.info("removed %d Triton shm regions with prefix %s", len(removed), prefix)
    return removed


class TritonProcess:
    """One running tritonserver; `start()` returns once it is ready."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        settings: TritonSettings,
        ports: TritonPorts,
        shm_prefix: str,
        log_path: Path | None,
    ) -> None:
        self._popen = popen
        self.settings = settings
        self.ports = ports
        self.shm_prefix = shm_prefix
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def http_url(self) -> str:
        """`host:port`, as tritonclient wants it (no scheme)."""
        return f"{self.settings.host}:{self.ports.http}"

    @classmethod
    async def start(
        cls,
        settings: TritonSettings,
        *,
        log_path: Path | None = None,
        ready_timeout_seconds: float = 30.0,
    ) -> TritonProcess:
        """Start Triton on free loopback ports and wait until it is ready.

        Its output goes to `log_path` (appended) or nowhere. A port taken between choosing
        and binding it is retried with new ports; any other failure raises
        `TritonStartFailed` with the end of Triton's log.
        """
        if not os.access(settings.binary, os.X_OK):
            raise TritonStartFailed(f"{settings.binary} is not an executable (run `make setup`)")
        last_error: TritonStartFailed | None = None
        for _attempt in range(_START_ATTEMPTS):
            process = cls._spawn(settings, log_path)
            try:
                await process.wait_ready(ready_timeout_seconds)
            except TritonStartFailed as e:
                await process.stop(timeout_seconds=5.0)
                last_error = e
                if "address already in use" in str(e).lower():
                    log.info("Triton port taken, retrying with new ports")
                    continue
                raise
            log.info("tritonserver pid %d ready on %s", process.pid, process.http_url)
            return process
        assert last_error is not None
        raise last_error

    @classmethod
    def _spawn(cls, settings: TritonSettings, log_path: Path | None) -> TritonProcess:
        ports = pick_ports(metrics=settings.metrics)
        shm_prefix = new_shm_prefix()
        command = triton_command(settings, ports, shm_prefix=shm_prefix)
        output: IO[bytes] | int = subprocess.DEVNULL
        if log_path is not None:
            output = log_path.open("ab")
        try:
            popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=settings.env,
                start_new_session=True,
            )
        finally:
            if not isinstance(output, int):
                output.close()
        log.debug("started tritonserver pid %d: %s", popen.pid, " ".join(command))
        return cls(popen, settings, ports, shm_prefix, log_path)

    def returncode(self) -> int | None:
        """None while Triton runs, else its exit status (negative: killed by that signal)."""
        return self._popen.poll()

    async def wait_ready(self, timeout_seconds: float) -> None:
        deadline = time.monotonic() + timeout_seconds
        url = f"http://{self.http_url}/v2/health/ready"
        # trust_env=False: a proxy from the environment must not see loopback traffic.
        async with httpx.AsyncClient(timeout=1.0, trust_env=False) as client:
            while True:
                code = self.returncode()
                if code is not None:
                    raise TritonStartFailed(
                        f"tritonserver exited with status {code} while starting: {self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        return
                if time.monotonic() >= deadline:
                    raise TritonStartFailed(
                        f"tritonserver not ready within {timeout_seconds} s: {self.log_tail()}"
                    )
                await asyncio.sleep(_POLL_SECONDS)

    def log_tail(self) -> str:
        if self.log_path is None:
            return "(no log kept)"
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES))
                return f.read().decode("utf-8", "replace").strip()
        except OSError as e:
            return f"(log unreadable: {e})"

    def send_signal(self, sig: int) -> None:
        """Signal Triton's whole process group (its stubs included)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._popen.pid, sig)

    async def wait(self, timeout_seconds: float) -> int | None:
        """Wait for Triton to exit; its status, or None if it still runs at the deadline."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            code = self.returncode()
            if code is not None or time.monotonic() >= deadline:
                return code
            await asyncio.sleep(_POLL_SECONDS)

    async def stop(self, timeout_seconds: float = 10.0) -> int:
        """SIGTERM the group, SIGKILL it at the deadline, then remove Triton's shm regions."""
        if self.returncode() is None:
            self.send_signal(signal.SIGTERM)
            if await self.wait(timeout_seconds) is None:
                log.warning("tritonserver pid %d ignored SIGTERM; killing it", self.pid)
        return await self.kill()

    async def kill(self) -> int:
        """SIGKILL the group (stubs included), reap Triton, remove its shm regions."""
        self.send_signal(signal.SIGKILL)
        code = await self.wait(10.0)
        if code is None:
            raise TritonStartFailed(f"tritonserver pid {self.pid} survived SIGKILL")
        self.cleanup()
        return code

    def cleanup(self) -> list[Path]:
        """Remove this Triton's shm regions (call only once it is dead)."""
        return remove_shm_regions(self.shm_prefix)
