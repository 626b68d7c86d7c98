"""A real tritonserver for tests: started in its own process group, killed as a group, its
/dev/shm regions removed, nothing left running.

`make setup` installs the server into `.venv-triton` (tools/install_triton.py); a missing
install fails the test loudly instead of skipping it.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http.aio as triton_http

from modelswap_sidecar.triton.config import ModelswapParameters
from modelswap_sidecar.triton.driver import TritonDriver
from modelswap_sidecar.triton.process import TritonProcess, TritonSettings, shm_regions
from modelswap_sidecar.triton.repository import ModelRepository

ROOT = Path(__file__).resolve().parents[2]
TRITONSERVER = ROOT / ".venv-triton" / "bin" / "tritonserver"
MODELS = ROOT / "tests" / "data" / "triton_models"


def tritonserver_binary() -> Path:
    if not TRITONSERVER.exists():
        pytest.fail(
            f"{TRITONSERVER} is missing: `make setup` installs it (tools/install_triton.py)"
        )
    return TRITONSERVER


def parameters_for(uid: str, socket_path: Path) -> ModelswapParameters:
    return ModelswapParameters(
        uid=uid,
        gpu_ordinal=0,
        weights_bytes=1 << 20,
        kv_cache_bytes=0,
        agent_socket=str(socket_path),
    )


def new_uid() -> str:
    return str(uuid.uuid4())


@dataclass
class RunningTriton:
    process: TritonProcess
    driver: TritonDriver
    client: triton_http.InferenceServerClient
    root: Path

    async def echo(self, uid: str, values: list[float]) -> tuple[list[float], str, int]:
        """Infer through Triton's HTTP API; (OUTPUT0, UID, stub PID) of the echo model."""
        data = np.array(values, dtype=np.float32)
        request = triton_http.InferInput("INPUT0", list(data.shape), "FP32")
        request.set_data_from_numpy(data)
        result = await self.client.infer(TritonDriver.name_of(uid), [request])
        out = result.as_numpy("OUTPUT0")
        uid_out = result.as_numpy("UID")
        pid_out = result.as_numpy("PID")
        assert out is not None and uid_out is not None and pid_out is not None
        answered_uid = uid_out[0]
        if isinstance(answered_uid, bytes):
            answered_uid = answered_uid.decode()
        return [float(v) for v in out], str(answered_uid), int(pid_out[0])


@contextlib.asynccontextmanager
async def running_triton(tmp_path: Path) -> AsyncIterator[RunningTriton]:
    """A ready Triton with an empty repository under `tmp_path`; everything torn down after."""
    repository = ModelRepository(tmp_path / "repository")
    repository.create()
    settings = TritonSettings(binary=tritonserver_binary(), model_repository=repository.root,
                              exit_timeout_seconds=2)  # fmt: skip
    log_path = tmp_path / "triton.log"
    process = await TritonProcess.start(settings, log_path=log_path)
    try:
        driver = TritonDriver(process.http_url, repository)
        client = triton_http.InferenceServerClient(process.http_url)
        try:
            yield RunningTriton(process, driver, client, tmp_path)
        finally:
            await client.close()
            await driver.close()
    finally:
        await process.kill()
        leftover = shm_regions(process.shm_prefix)
        assert not leftover, f"shm regions left behind: {leftover}"


def copy_model(tmp_path: Path, model: str = "echo") -> Path:
    """A private copy of a test model directory (tests may edit it)."""
    target = tmp_path / "sources" / f"{model}-{uuid.uuid4().hex[:8]}"
    shutil.copytree(MODELS / model, target)
    return target
