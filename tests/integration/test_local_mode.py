"""`modelswap up` / `modelswap status` as a user runs them: real Triton, the agent on a sim
GPU, the gateway on localhost, models from a folder of YAML files.

Each test runs `modelswap up` in its own process group with its own run directory and
stops it with SIGINT (what Ctrl-C sends); nothing may be left running afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from examples.models.reference import mlp_checksum, mlp_forward, mlp_infer_body, mlp_input
from tests.support.local_up import leftovers, start_up, stop_up, wait_pushed
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"
MIB = 1 << 20

CLASSIFY = """\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: classify
spec:
  model:
    source: {uri: /models/mlp}
    weightsBytes: 32Mi
  swapPolicy:
    idleAfter: never
    minResident: 1s
    onSwapOut: host
"""

BAD = """\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: broken
spec:
  model:
    source: {uri: /models/mlp}
    weightsBytes: 32Mi
  swapPolicy:
    idleAfter: five minutes
"""


@dataclass
class LocalMode:
    process: subprocess.Popen[bytes]
    folder: Path
    run_dir: Path
    log_path: Path
    state: dict[str, Any]

    @property
    def token(self) -> str:
        return Path(self.state["tokenFile"]).read_text().strip()

    def models(self) -> dict[str, dict[str, Any]]:
        r = httpx.get(
            f"{self.state['controlUrl']}/v1/models",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=10,
            trust_env=False,
        )
        r.raise_for_status()
        return {m["name"]: m for m in r.json()["models"]}

    def phase(self, name: str) -> str | None:
        model = self.models().get(name)
        return None if model is None else str(model["phase"])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def status(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "modelswap_api.cli", "status", "--run-dir", str(self.run_dir)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def infer_mlp(self, seed: int) -> None:
        x = mlp_input(seed)
        body = mlp_infer_body(x)
        r = httpx.post(
            f"{self.state['gatewayUrl']}/v2/models/classify/infer",
            json=body,
            timeout=60,
            trust_env=False,
        )
        assert r.status_code == 200, r.text
        outputs = {o["name"]: o for o in r.json()["outputs"]}
        got = np.array(outputs["OUTPUT0"]["data"]).reshape(x.shape[0], -1)
        assert np.allclose(got, mlp_forward(x), rtol=1e-4, atol=1e-4)
        assert int(outputs["CHECKSUM"]["data"][0]) == mlp_checksum(32 * MIB)

    def infer_mlp_grpc(self, seed: int) -> None:
        """The same through the gateway's gRPC front, by the bare name (local mode)."""
        x = mlp_input(seed)
        client = grpcclient.InferenceServerClient(self.state["gatewayGrpcAddress"])
        try:
            tensor = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            result = client.infer("classify", [tensor], client_timeout=60)
        finally:
            client.close()
        assert result.get_response().model_name == "classify"
        got = result.as_numpy("OUTPUT0").astype(np.float64)
        assert np.allclose(got, mlp_forward(x), rtol=1e-4, atol=1e-4)
        assert int(result.as_numpy("CHECKSUM").reshape(-1)[0]) == mlp_checksum(32 * MIB)

    def stop(self) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise AssertionError("modelswap up did not stop within 60 s of SIGINT") from None


@contextlib.contextmanager
def local_mode(
    tmp_path: Path, files: dict[str, str], *, until_pushed: bool = True
) -> Iterator[LocalMode]:
    """`modelswap up` over `files`, yielded once it has pushed them (`until_pushed`) or
    once its state file names the gateway."""
    folder, run_dir, log_path = tmp_path / "deployments", tmp_path / "run", tmp_path / "up.log"
    process = start_up(folder, files, run_dir, log_path, MODELS, "--sim-gpu-bytes", "128Mi")
    running = None
    try:
        state = wait_pushed(process, run_dir, log_path, until_pushed=until_pushed)
        running = LocalMode(process, folder, run_dir, log_path, state)
        yield running
    finally:
        shm_prefix = running.state.get("shmPrefix") if running else None
        stop_up(process)
        left = leftovers(run_dir, shm_prefix, process.pid)
        assert not left, f"left running: {left}"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_invalid_file_is_reported_by_field_and_skipped_while_the_rest_run_and_status_prints_the_columns(
    tmp_path: Path,
) -> None:
    with local_mode(tmp_path, {"classify.yaml": CLASSIFY, "broken.yaml": BAD}) as local:
        wait_for(
            lambda: local.phase("classify") == "Resident",
            timeout_seconds=90,
            what="classify to load",
        )
        local.infer_mlp(1)  # the valid file serves
        local.infer_mlp_grpc(2)  # through the gRPC front too, at the address printed
        assert f"gateway gRPC {local.state['gatewayGrpcAddress']}" in local.log()
        assert "broken" not in local.models()
        log = local.log()
        assert "skipped" in log and "broken.yaml" in log
        assert "spec.swapPolicy.idleAfter" in log
        state = json.loads((local.run_dir / "local.json").read_text())
        assert any("spec.swapPolicy.idleAfter" in p for p in state["problems"])

        status = local.status()
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert lines[0].split() == [
            "NAME",
            "MODEL",
            "NODE",
            "PHASE",
            "RESIDENT",
            "LAST-REQUEST",
            "AGE",
        ]
        row = next(line.split() for line in lines[1:] if line.startswith("classify"))
        assert row[:5] == ["classify", "classify", "local", "Resident", "32Mi"]
        assert row[5] != "<none>"  # the request above
        assert any("skipped:" in line and "broken.yaml" in line for line in lines)
        assert f"gateway gRPC: {local.state['gatewayGrpcAddress']}" in lines


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_yaml_edit_changes_the_policy_live_and_sigint_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    with local_mode(tmp_path, {"classify.yaml": CLASSIFY}) as local:
        wait_for(
            lambda: local.phase("classify") == "Resident",
            timeout_seconds=90,
            what="classify to load",
        )
        local.infer_mlp(2)
        assert local.models()["classify"]["generation"] == 1
        # idleAfter: never -> 1s: the running agent swaps the model out once idle.
        file = local.folder / "classify.yaml"
        file.write_text(CLASSIFY.replace("idleAfter: never", "idleAfter: 1s"))
        wait_for(
            lambda: local.models()["classify"]["generation"] == 2,
            timeout_seconds=30,
            what="the edit to reach the agent",
        )
        wait_for(
            lambda: local.phase("classify") == "SwappedOut",
            timeout_seconds=30,
            what="the idle swap-out the edited policy asks for",
        )
        local.infer_mlp(3)  # and a request brings it back
        assert local.models()["classify"]["swapIns"] >= 1

        shm_prefix = local.state["shmPrefix"]
        assert local.stop() == 0
        assert not leftovers(local.run_dir, shm_prefix, local.process.pid)
        status = local.status()
        assert status.returncode == 1
        assert "not running" in status.stderr


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ready_means_the_folder_s_models_are_known_and_no_request_is_404_meanwhile(
    tmp_path: Path,
) -> None:
    """From the moment the gateway is named, `/v2/health/ready` is 200 only once the folder's
    models are known, and `classify` is never answered 404 (503 + Retry-After until then)."""
    with local_mode(tmp_path, {"classify.yaml": CLASSIFY}, until_pushed=False) as local:
        url = local.state["gatewayUrl"]
        body = mlp_infer_body(mlp_input(1))
        answers: list[tuple[str, int, str | None]] = []  # (probe, status, reason)

        def answer(probe: str, r: httpx.Response) -> None:
            reason = None
            if r.status_code >= 400:
                assert r.headers.get("Retry-After") or r.status_code != 503, r.text
                reason = r.json().get("reason")
            answers.append((probe, r.status_code, reason))

        def served() -> bool:
            assert local.process.poll() is None, local.log()
            with contextlib.suppress(httpx.TransportError):
                answer("ready", httpx.get(f"{url}/v2/health/ready", timeout=10, trust_env=False))
            with contextlib.suppress(httpx.TransportError):
                r = httpx.post(
                    f"{url}/v2/models/classify/infer", json=body, timeout=60, trust_env=False
                )
                answer("classify", r)
                return r.status_code == 200
            return False

        wait_for(served, timeout_seconds=90, what="classify to answer 200")
        assert not [a for a in answers if a[1] == 404], answers
        ready = httpx.get(f"{url}/v2/health/ready", timeout=10, trust_env=False)
        assert ready.status_code == 200, ready.text
        # once ready, the model is known: no ModelNotKnownYet after the first ready 200
        first_ready = next((i for i, a in enumerate(answers) if a[:2] == ("ready", 200)), None)
        if first_ready is not None:
            later = answers[first_ready:]
            assert not [a for a in later if a[2] == "ModelNotKnownYet"], answers
        gone = httpx.post(f"{url}/v2/models/gpt/infer", json=body, timeout=10, trust_env=False)
        assert gone.status_code == 404, gone.text


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_removed_file_s_model_is_unloaded_and_no_longer_listed(tmp_path: Path) -> None:
    with local_mode(tmp_path, {"classify.yaml": CLASSIFY}) as local:
        wait_for(
            lambda: local.phase("classify") == "Resident",
            timeout_seconds=90,
            what="classify to load",
        )
        (local.folder / "classify.yaml").unlink()
        wait_for(
            lambda: "classify" not in local.models(),
            timeout_seconds=60,
            what="classify to be forgotten",
        )
        gone = httpx.post(
            f"{local.state['gatewayUrl']}/v2/models/classify/infer",
            json=mlp_infer_body(mlp_input(1)),
            timeout=10,
            trust_env=False,
        )
        assert gone.status_code == 404, gone.text
