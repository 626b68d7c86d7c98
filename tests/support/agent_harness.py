"""Real processes for the agent's integration tests: a restartable Triton on fixed loopback
ports, the agent (`modelswap sidecar`) as a child, a control API client, and calls into
the example models (examples/models).

Every process runs in its own process group and is killed as a group; Triton's /dev/shm
regions are removed; nothing is left running. Waits are on conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import yaml

from examples.models.reference import mlp_infer_body
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.policy import effective_policy
from modelswap_sidecar.triton.naming import triton_model_name
from modelswap_sidecar.triton.process import (
    TritonPorts,
    TritonProcess,
    TritonSettings,
    new_shm_prefix,
    pick_ports,
    shm_regions,
    triton_command,
)
from modelswap_sidecar.triton.stubs import descendant_stub_pids
from tests.support.triton_server import tritonserver_binary
from tests.support.waiting import until_async

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "models"
MIB = 1 << 20
TOKEN = "test-token-" + "x" * 20
T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]], *, timeout_seconds: float = 30.0, what: str = "condition"
) -> T:
    """`waiting.until_async` with the agent's pace: 30 s by default, a look (a request to
    the agent, usually) every 50 ms."""
    return await until_async(probe, what, timeout_seconds, poll_seconds=0.05)


# -- Triton ---------------------------------------------------------------------------------


class Triton:
    """One tritonserver at fixed ports, restartable (a node's Triton keeps its ports)."""

    def __init__(self, workdir: Path) -> None:
        self.repository = workdir / "repository"
        self.repository.mkdir(parents=True, exist_ok=True)
        self.pid_file = workdir / "triton.pid"
        self.log_path = workdir / "triton.log"
        self.ports: TritonPorts = pick_ports(metrics=False)
        self.settings = TritonSettings(
            binary=tritonserver_binary(), model_repository=self.repository, exit_timeout_seconds=2
        )
        self.process: TritonProcess | None = None
        self.prefixes: list[str] = []

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.ports.http}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self) -> None:
        prefix = new_shm_prefix()
        self.prefixes.append(prefix)
        command = triton_command(self.settings, self.ports, shm_prefix=prefix)
        popen = spawn(command, self.log_path)
        self.process = TritonProcess(popen, self.settings, self.ports, prefix, self.log_path)
        await self.process.wait_ready(30.0)
        self.pid_file.write_text(str(popen.pid))

    async def kill9(self) -> None:
        if self.process is not None:
            await self.process.kill()  # the whole group (stubs too), shm regions removed

    async def close(self) -> None:
        await self.kill9()
        for prefix in self.prefixes:
            assert not shm_regions(prefix), f"Triton shm regions left: {shm_regions(prefix)}"

    def stub_pids(self, uid: str) -> list[int]:
        return descendant_stub_pids(self.pid, triton_model_name(uid))


# -- the agent ------------------------------------------------------------------------------


@dataclass
class AgentConfig:
    gpu_bytes: tuple[int, ...] = (128 * MIB, 128 * MIB)
    grace_seconds: float = 3.0
    interval_seconds: float = 0.25
    local_mode: bool = True
    retry_failed_seconds: float = 60.0
    #: triton.loadTimeoutSeconds: a Triton load's bound, and a stalled reload's
    load_timeout_seconds: float = 60.0
    extra: dict[str, Any] = field(default_factory=dict)


class Agent:
    """`modelswap sidecar` as a child process, with its settings file under `workdir`."""

    def __init__(self, workdir: Path, triton: Triton, config: AgentConfig) -> None:
        self.workdir = workdir
        self.triton = triton
        self.state_dir = workdir / "agent-state"
        self.log_path = workdir / "agent.log"
        self.token_file = workdir / "token"
        self.token_file.write_text(TOKEN)
        self.settings_file = workdir / "agent.yaml"
        self.control_port = _free_port()
        self.metrics_port = _free_port()
        doc: dict[str, Any] = {
            "nodeName": "node-a",
            "localMode": config.local_mode,
            "gpus": [
                {"uuid": f"sim-gpu-{i}", "capacityBytes": b} for i, b in enumerate(config.gpu_bytes)
            ],
            "hostStore": {"dir": str(workdir / "store"), "capacityBytes": "1Gi"},
            "socketDir": str(workdir / "sock"),
            "stateDir": str(self.state_dir),
            "sourceCache": {
                "dir": str(workdir / "source-cache"),
                "capacityBytes": "64Mi",
                "maxDownloadBytes": "1Mi",
                "trustEnv": False,
            },
            "modelRoots": {"/models": str(EXAMPLES)},
            "control": {
                "host": "127.0.0.1",
                "port": self.control_port,
                "tokenFile": str(self.token_file),
                "graceSeconds": config.grace_seconds,
            },
            "metrics": {"host": "127.0.0.1", "port": self.metrics_port},
            "triton": {
                "url": triton.url,
                # used when a test sets gateway.grpcPort (the gateway's gRPC front)
                "grpcUrl": f"127.0.0.1:{triton.ports.grpc}",
                "repository": str(triton.repository),
                "pidFile": str(triton.pid_file),
                "loadTimeoutSeconds": config.load_timeout_seconds,
            },
            "policy": {
                "intervalSeconds": config.interval_seconds,
                "retryFailedSeconds": config.retry_failed_seconds,
                "drainTimeoutSeconds": 20,
            },
            "logLevel": "info",
            "jsonLogs": False,
            **config.extra,
        }
        self.settings_file.write_text(yaml.safe_dump(doc))
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    async def start(self) -> None:
        endpoints = self.state_dir / "agent.json"
        with contextlib.suppress(FileNotFoundError):
            endpoints.unlink()
        self.popen = spawn(
            [sys.executable, "-m", "modelswap_api.cli", "sidecar", "--config",
             str(self.settings_file)],
            self.log_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip

        async def started() -> bool:
            assert self.popen is not None
            if self.popen.poll() is not None:
                raise AssertionError(f"agent exited: {self.log_tail()}")
            return endpoints.exists()

        await eventually(started, timeout_seconds=30, what="the agent to start")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    async def kill9(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            await asyncio.to_thread(self.popen.wait, 10)

    async def stop(self) -> int | None:
        if self.popen is None or self.popen.poll() is not None:
            return None if self.popen is None else self.popen.returncode
        os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            return await asyncio.to_thread(self.popen.wait, 20)
        except subprocess.TimeoutExpired:
            await self.kill9()
            return None


def spawn(command: list[str], log_path: Path, env: dict[str, str] | None = None) -> Any:
    """Start `command` in its own session (process group), output appended to `log_path`."""
    with log_path.open("ab") as out:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )


def _free_port() -> int:
    from modelswap_sidecar.triton.process import free_loopback_port

    return free_loopback_port()


# -- the control API ------------------------------------------------------------------------


def entry(
    uid: str,
    *,
    model: str = "mlp",
    name: str | None = None,
    namespace: str = "default",
    generation: int = 1,
    weights: str | None = None,
    kv: str | None = None,
    swap_policy: dict[str, Any] | None = None,
    kv_cache: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A desired-set entry for one of the example models (wire form)."""
    weights = weights or ("32Mi" if model == "mlp" else "64Mi")
    spec_model: dict[str, Any] = {
        "runtime": "triton",
        "source": source or {"uri": f"/models/{model}"},
        "weightsBytes": weights,
    }
    if kv or model == "tinylm":
        spec_model["kvCacheBytes"] = kv or "4Mi"
    spec: dict[str, Any] = {"model": spec_model}
    if swap_policy:
        spec["swapPolicy"] = swap_policy
    if kv_cache or model == "tinylm":  # a small host tier: the store is sized for tests
        spec["kvCache"] = kv_cache or {"offloadAfterTokens": 32, "hostBytes": "2Mi"}
    return {
        "uid": uid,
        "namespace": namespace,
        "name": name or model,
        "generation": generation,
        "spec": spec,
        "policy": effective_policy(spec, BUILTIN_DEFAULTS).to_status().to_dict(),
    }


def new_uid() -> str:
    return str(uuid.uuid4())


class Control:
    def __init__(
        self, base_url: str, token: str = TOKEN, *, verify: ssl.SSLContext | bool = True
    ) -> None:
        self.token = token
        self.client = self._client(base_url, verify)
        self.counter = 0
        self.term = 1

    def _client(self, base_url: str, verify: ssl.SSLContext | bool) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=60.0,
            trust_env=False,
            verify=verify,
        )

    async def switch_to(self, base_url: str, *, verify: ssl.SSLContext | bool) -> None:
        """Talk to `base_url` from now on (an agent serving HTTPS: the pinned context)."""
        await self.client.aclose()
        self.client = self._client(base_url, verify)

    async def close(self) -> None:
        await self.client.aclose()

    async def put(
        self, entries: list[dict[str, Any]], *, term: int | None = None
    ) -> httpx.Response:
        self.counter += 1
        body = {
            "revision": {"term": self.term if term is None else term, "counter": self.counter},
            "entries": entries,
        }
        return await self.client.put("/v1/desired", json=body)

    async def desired(self, entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        response = await self.put(entries)
        assert response.status_code == 200, response.text
        return {r["uid"]: r for r in response.json()["results"]}

    async def models(self) -> dict[str, dict[str, Any]]:
        response = await self.client.get("/v1/models")
        assert response.status_code == 200, response.text
        return {m["uid"]: m for m in response.json()["models"]}

    async def node(self) -> dict[str, Any]:
        response = await self.client.get("/v1/node")
        assert response.status_code == 200, response.text
        found: dict[str, Any] = response.json()
        return found

    async def model(self, uid: str) -> dict[str, Any]:
        return (await self.models()).get(uid, {})

    async def wait_state(
        self, uid: str, *states: str, timeout_seconds: float = 60.0
    ) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            m = await self.model(uid)
            return m if m.get("state") in states else None

        return await eventually(probe, timeout_seconds=timeout_seconds, what=f"{uid} in {states}")

    async def swap(self, uid: str, direction: str) -> httpx.Response:
        return await self.client.post(f"/v1/models/{uid}/swap-{direction}")


# -- calling the example models ---------------------------------------------------------------


@dataclass(frozen=True)
class MlpAnswer:
    output: np.ndarray
    checksum: int
    restored: bool


class Models:
    """Inference through Triton's own HTTP API (what traffic that bypasses the gateway does)."""

    def __init__(self, triton: Triton) -> None:
        self.client = httpx.AsyncClient(
            base_url=f"http://{triton.url}", timeout=60.0, trust_env=False
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def mlp(self, uid: str, x: np.ndarray) -> MlpAnswer:
        body = mlp_infer_body(x)
        r = await self.client.post(f"/v2/models/{triton_model_name(uid)}/infer", json=body)
        assert r.status_code == 200, r.text
        outputs = {o["name"]: o for o in r.json()["outputs"]}
        out = outputs["OUTPUT0"]
        return MlpAnswer(
            output=np.array(out["data"], dtype=np.float32).reshape(out["shape"]),
            checksum=int(outputs["CHECKSUM"]["data"][0]),
            restored=bool(outputs["RESTORED"]["data"][0]),
        )

    async def tinylm(
        self, uid: str, prompt: list[int], max_tokens: int, delay_ms: int = 0
    ) -> list[dict[str, Any]]:
        """Every streamed response (TOKEN, INDEX, TIER, CHECKSUM, RESTORED), in order."""
        body: dict[str, Any] = {"PROMPT": prompt, "MAX_TOKENS": max_tokens}
        if delay_ms:
            body["DELAY_MS"] = delay_ms
        events = []
        url = f"/v2/models/{triton_model_name(uid)}/generate_stream"
        async with self.client.stream("POST", url, json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
        for e in events:
            assert "error" not in e, e
        return events


# -- independent checks: the stub's mappings of sim HBM ----------------------------------------

_MAPS = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S{4} \S+ \S+ \d+\s*(.*)$")


def sim_hbm_mapped_bytes(pid: int) -> int:
    """Bytes of sim-GPU memfd chunks the process maps now (read from /proc/<pid>/maps)."""
    total = 0
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            m = _MAPS.match(line.strip())
            if m and m.group(3).startswith("/memfd:modelswap-sim-gpu"):
                total += int(m.group(2), 16) - int(m.group(1), 16)
    return total


@dataclass
class Node:
    triton: Triton
    agent: Agent
    control: Control
    models: Models

    def parts(self) -> tuple[Triton, Agent, Control, Models]:
        return self.triton, self.agent, self.control, self.models


@contextlib.asynccontextmanager
async def node(tmp_path: Path, config: AgentConfig | None = None) -> AsyncIterator[Node]:
    """A Triton and an agent with their clients; everything torn down after."""
    triton = Triton(tmp_path)
    await triton.start()
    agent = Agent(tmp_path, triton, config or AgentConfig())
    control = Control(agent.base_url)
    models = Models(triton)
    try:
        await agent.start()
        yield Node(triton, agent, control, models)
    except BaseException:
        sys.stderr.write(f"--- agent log ---\n{agent.log_tail(8000)}\n")
        raise
    finally:
        await control.close()
        await models.close()
        code = await agent.stop()
        await triton.close()
        assert code in (0, None), f"agent exit status {code}: {agent.log_tail()}"
