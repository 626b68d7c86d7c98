"""Local mode's developer loop, as a developer runs it (real Triton, the agent on a sim GPU):

- reload on change: editing a served model's model.py makes local mode reload it and the
  new code answers (its host copy kept: the weights come back from the host store); a
  changed weight file reloads it from its files (host copy dropped); a model.py that fails
  to load is retried as soon as it is fixed; a model whose folder does not change is never
  reloaded (its runtime process is the same one throughout);
- the dev loop: with `modelswap up --dev` a plain Python process attaches as a dev model
  (`modelswap.io/dev: "true"`) through MODELSWAP_SOCKET, fills and commits its region, is
  swapped out by the idle rule and by hand and back in (by its own `in_use()` and by hand)
  with its bytes intact, and a second process restores them; it cannot attach as a
  Triton model; without `--dev` the same attach is refused, NotVouched, and the file is
  reported skipped.

Each test runs `modelswap up` in its own process group and run directory, on a copy of
tests/data/dev_loop/toy, and stops it with SIGINT; nothing may be left running.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelswap_sidecar.local.manifests import local_uid
from modelswap_sidecar.triton.naming import triton_model_name
from tests.support.local_up import leftovers, start_up, stop_up, wait_pushed
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "dev_loop"
MIB = 1 << 20
REGION_BYTES = 2 * MIB
WEIGHTS_FILE_BYTES = 64 << 10

pytestmark = [pytest.mark.slow]

TOY = """\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: {name}
spec:
  model:
    source: {{uri: /models/{name}}}
    weightsBytes: 2Mi
  swapPolicy:
    idleAfter: never
"""

DEV = """\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: mine
  annotations:
    modelswap.io/dev: "true"
spec:
  model:
    source: {uri: /models/mine}
    weightsBytes: 4Mi
  swapPolicy:
    idleAfter: 2s
    minResident: 1s
    onSwapOut: host
"""


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    run_dir: Path
    log_path: Path
    state: dict[str, Any]
    children: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def auth(self) -> dict[str, str]:
        token = Path(self.state["tokenFile"]).read_text().strip()
        return {"Authorization": f"Bearer {token}"}

    def control(self, method: str, path: str) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.state['controlUrl']}{path}",
            headers=self.auth,
            timeout=30,
            trust_env=False,
        )

    def model(self, name: str) -> dict[str, Any] | None:
        response = self.control("GET", "/v1/models")
        response.raise_for_status()
        return next((m for m in response.json()["models"] if m["name"] == name), None)

    def phase(self, name: str) -> str | None:
        model = self.model(name)
        return None if model is None else str(model["phase"])

    def local_state(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.run_dir / "local.json").read_text())
        return loaded

    def reloads(self, name: str) -> dict[str, Any]:
        entry = next(m for m in self.local_state()["models"] if m["name"] == name)
        return dict(entry.get("reloads") or {"count": 0})

    def infer(self, name: str) -> dict[str, Any] | None:
        """The toy model's answer ({VERSION, CHECKSUM, RESTORED, PID}), or None while it
        does not answer (reloading)."""
        body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
        try:
            r = httpx.post(
                f"{self.state['gatewayUrl']}/v2/models/{name}/infer",
                json=body,
                timeout=30,
                trust_env=False,
            )
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        return {o["name"]: o["data"][0] for o in r.json()["outputs"]}

    def status(self) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "modelswap_api.cli", "status", "--run-dir", str(self.run_dir)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def modelswap_up(
    tmp_path: Path, files: dict[str, str], model_root: Path, *flags: str
) -> Iterator[Up]:
    """`modelswap up` over `files` (models in `model_root`), yielded once it has pushed."""
    folder, run_dir, log_path = tmp_path / "deployments", tmp_path / "run", tmp_path / "up.log"
    process = start_up(
        folder, files, run_dir, log_path, model_root,
        "--sim-gpu-bytes", "64Mi", "--allocator", "sim", *flags,
    )  # fmt: skip
    running = None
    try:
        state = wait_pushed(process, run_dir, log_path)
        running = Up(process, run_dir, log_path, state)
        yield running
    finally:
        for child in running.children if running else []:
            if child.poll() is None:
                child.kill()
            child.wait()
        shm_prefix = running.state.get("shmPrefix") if running else None
        stop_up(process)
        left = leftovers(run_dir, shm_prefix, process.pid)
        assert not left, f"left running: {left}"
    assert process.returncode == 0, log_path.read_text(errors="replace")


# -- reload on change ------------------------------------------------------------------------


def weights(seed: int) -> bytes:
    return random.Random(seed).randbytes(WEIGHTS_FILE_BYTES)


def region_crc(data: bytes) -> int:
    """CRC-32 of `data` tiled across the weights region (what the toy model answers)."""
    return zlib.crc32((data * (REGION_BYTES // len(data) + 1))[:REGION_BYTES])


def save(path: Path, text: bytes) -> None:
    """As an editor saves: a temporary file beside it, renamed over it."""
    tmp = path.with_name(f".{path.name}.swp")
    tmp.write_bytes(text)
    os.replace(tmp, path)


def toy_copy(model_root: Path, name: str, seed: int) -> Path:
    folder = model_root / name
    shutil.copytree(DATA / "toy", folder)
    (folder / "1" / "weights.bin").write_bytes(weights(seed))
    return folder


@pytest.mark.timeout(420)
def test_editing_a_models_code_or_weights_reloads_it_and_an_unchanged_folder_is_never_reloaded(
    tmp_path: Path,
) -> None:
    models = tmp_path / "models"
    toy = toy_copy(models, "toy", seed=1)
    toy_copy(models, "steady", seed=5)
    files = {"toy.yaml": TOY.format(name="toy"), "steady.yaml": TOY.format(name="steady")}
    with modelswap_up(tmp_path, files, models) as up:
        first = wait_for(lambda: up.infer("toy"), timeout_seconds=120, what="toy to answer")
        assert (first["VERSION"], first["RESTORED"]) == (1, False)
        assert first["CHECKSUM"] == region_crc(weights(1))
        steady = wait_for(lambda: up.infer("steady"), timeout_seconds=60, what="steady")
        assert "reload       on" in up.log()

        # 1. model.py changes: reloaded, the new code answers, the host copy restored
        model_py = toy / "1" / "model.py"
        save(model_py, model_py.read_bytes().replace(b"VERSION = 1", b"VERSION = 2"))
        second = wait_for(
            lambda: (a := up.infer("toy")) and a["VERSION"] == 2 and a,
            timeout_seconds=90,
            what="toy to answer with its new code",
        )
        assert second["PID"] != first["PID"]  # a new runtime process
        assert second["RESTORED"] is True  # only code changed: the host copy was kept
        assert second["CHECKSUM"] == region_crc(weights(1))
        note = up.reloads("toy")
        assert (note["count"], note["what"], note["hostCopy"]) == (1, "1/model.py changed", "kept")
        status = up.status()
        assert "reloaded: toy " in status and "(1/model.py changed; host copy kept)" in status

        # 2. a weight file changes: reloaded from its files, the host copy dropped
        save(toy / "1" / "weights.bin", weights(2))
        third = wait_for(
            lambda: (a := up.infer("toy")) and a["CHECKSUM"] == region_crc(weights(2)) and a,
            timeout_seconds=90,
            what="toy to answer with its new weights",
        )
        assert (third["VERSION"], third["RESTORED"]) == (2, False)
        assert up.reloads("toy")["hostCopy"] == "dropped"

        # 3. a model.py that fails to load, then fixed: retried at once, not after a minute
        save(model_py, model_py.read_bytes().replace(b"VERSION = 2", b"VERSION = = 3"))
        wait_for(lambda: up.phase("toy") == "Failed", timeout_seconds=90, what="toy to fail")
        assert "toy: Failed" in up.status()
        fixed_at = time.monotonic()
        save(model_py, model_py.read_bytes().replace(b"VERSION = = 3", b"VERSION = 3"))
        fourth = wait_for(
            lambda: (a := up.infer("toy")) and a["VERSION"] == 3 and a,
            timeout_seconds=50,  # the agent's own retry of a failed load waits 60 s
            what="the fixed toy to answer",
        )
        assert time.monotonic() - fixed_at < 50
        assert fourth["CHECKSUM"] == region_crc(weights(2))
        assert up.reloads("toy")["count"] == 4  # one per edit: none twice, none for caches

        # the model whose folder never changed was never reloaded
        assert up.reloads("steady") == {"count": 0}
        still = up.infer("steady")
        assert still is not None and still["PID"] == steady["PID"]
        assert up.phase("steady") == "Resident"


# -- the dev loop ----------------------------------------------------------------------------


class DevProcess:
    """tests/data/dev_loop/dev_process.py: a developer's own process (a script)."""

    def __init__(self, up: Up, model: str, seed: int, region_bytes: int = 4 * MIB) -> None:
        env = {**os.environ, "MODELSWAP_SOCKET": up.state["agentSocket"]}
        self.process = subprocess.Popen(
            [sys.executable, str(DATA / "dev_process.py"), model, str(region_bytes), str(seed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        up.children.append(self.process)

    def event(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the dev process exited ({self.process.wait()})"
        event: dict[str, Any] = json.loads(line)
        return event

    def send(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.event()


def attach_refusal(up: Up, model: str) -> dict[str, Any]:
    process = DevProcess(up, model, seed=9)
    event = process.event()
    assert process.process.wait(timeout=30) == 3
    return event


@pytest.mark.timeout(300)
def test_a_plain_process_attaches_as_a_dev_model_and_swaps_out_and_in_with_its_bytes_intact(
    tmp_path: Path,
) -> None:
    models = tmp_path / "models"
    toy_copy(models, "toy", seed=1)
    files = {"mine.yaml": DEV, "toy.yaml": TOY.format(name="toy")}
    engine_name = triton_model_name(local_uid("default", "mine"))
    with modelswap_up(tmp_path, files, models, "--dev") as up:
        socket_line = f"export MODELSWAP_SOCKET={up.state['agentSocket']}"
        assert socket_line in up.log() and f"default/mine: attach({engine_name!r}" in up.log()
        waiting = wait_for(lambda: up.model("mine"), timeout_seconds=30, what="mine to be held")
        assert waiting["reason"] == "DevModel" and engine_name in waiting["message"]
        assert up.phase("mine") == "Loading"  # registered, waiting for its process
        status = up.status()
        assert socket_line.replace("export", "dev loop: export") in status
        assert f"dev: mine: attach({engine_name!r}" in status

        dev = DevProcess(up, engine_name, seed=7)
        attached = dev.event()
        assert attached["event"] == "attached" and attached["restored"] is False
        crc = attached["crc"]
        wait_for(lambda: up.phase("mine") == "Resident", timeout_seconds=30, what="committed")

        # the idle rule swaps it out; its own in_use() brings it back, bytes intact
        wait_for(lambda: up.phase("mine") == "SwappedOut", timeout_seconds=30, what="idle")
        assert dev.send("check") == {"event": "checked", "crc": crc, "state": "resident"}

        # by hand: swap out, then in, through the control API
        uid = local_uid("default", "mine")
        out = up.control("POST", f"/v1/models/{uid}/swap-out")
        assert out.status_code == 200 and out.json()["outcome"] in ("completed", "unchanged")
        wait_for(lambda: up.phase("mine") == "SwappedOut", timeout_seconds=30, what="out")
        back = up.control("POST", f"/v1/models/{uid}/swap-in")
        assert back.status_code == 200 and back.json()["outcome"] == "completed", back.text
        assert dev.send("check")["crc"] == crc
        info = up.model("mine")
        assert info is not None and info["swapIns"] >= 2 and info["swapOuts"] >= 2

        # the process goes; the next one restores the bytes it committed
        assert dev.send("quit")["event"] == "closed"
        assert dev.process.wait(timeout=30) == 0
        again = DevProcess(up, engine_name, seed=8)  # a different seed: it fills nothing
        restored = again.event()
        assert (restored["restored"], restored["crc"]) == (True, crc)
        assert again.send("check")["crc"] == crc

        # a plain process cannot act for a model Triton serves, --dev or not
        wait_for(lambda: up.phase("toy") == "Resident", timeout_seconds=90, what="toy")
        toy = triton_model_name(local_uid("default", "toy"))
        refused = attach_refusal(up, toy)
        assert (refused["event"], refused["code"]) == ("refused", "NotVouched")
        assert again.send("quit")["event"] == "closed"


@pytest.mark.timeout(180)
def test_without_dev_a_dev_model_is_skipped_and_its_attach_is_refused_not_vouched(
    tmp_path: Path,
) -> None:
    with modelswap_up(tmp_path, {"mine.yaml": DEV}, tmp_path) as up:
        assert up.state["dev"] is False
        status = up.status()
        assert "skipped: " in status and "metadata.annotations[modelswap.io/dev]" in status
        assert "modelswap up --dev" in status
        assert not (up.run_dir / "dev-models.json").exists()
        refused = attach_refusal(up, triton_model_name(local_uid("default", "mine")))
        assert (refused["event"], refused["code"]) == ("refused", "NotVouched")
