"""What `bench.compare` and `bench.gateway` run against: one modelswap node in local mode
(`modelswap up`, its public entry point: agent + Triton + gateway, sim GPUs) serving
ModelDeployments written into a temporary folder, a plain Triton beside it for the
baselines, and checked calls into the example models: the numpy toys (mlp, tinylm, the
generated big model) against examples/models/reference.py, the real Hugging Face ones
(embed: all-MiniLM-L6-v2; tinyllama) against the same weights run with plain transformers
in this process (reference.py's helpers).

Every child runs in its own process group and is stopped as a group; temporary folders
and Triton's /dev/shm regions are removed.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from bench import scratch
from examples.models import reference
from modelswap_api.quantities import parse_bytes
from modelswap_sidecar.triton.naming import triton_model_name
from modelswap_sidecar.triton.process import (
    TritonPorts,
    TritonSettings,
    free_loopback_port,
    new_shm_prefix,
    remove_shm_regions,
    triton_command,
)
from modelswap_sidecar.triton.stubs import descendant_stub_pids

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "models"
#: the numpy toy models' folders, wherever reference.py keeps them
TOY_DIRS = {"mlp": reference.MLP_DIR, "tinylm": reference.TINYLM_DIR}
#: the real example models: Hugging Face models in a python backend through
#: modelswap_client.torch (examples/models/<name>, deployed by examples/<name>.yaml)
REAL_MODELS = ("embed", "tinyllama")
TRITONSERVER = ROOT / ".venv-triton" / "bin" / "tritonserver"
BIG_MODEL = Path(__file__).resolve().parent / "models" / "big" / "model.py"
MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class ModelCase:
    """One model the benches deploy: its name, example source and region sizes."""

    name: str
    source: str  # folder under the model root: mlp, tinylm or big
    weights_bytes: int
    kv_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes

    @property
    def real(self) -> bool:
        """A real Hugging Face example (its stub imports torch and transformers)."""
        return self.source in REAL_MODELS


def real_case(name: str) -> ModelCase:
    """A real example model with the sizes its own ModelDeployment (examples/<name>.yaml)
    gives it, so the bench runs what ships."""
    doc = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    model = doc["spec"]["model"]
    kv = model.get("kvCacheBytes")
    return ModelCase(name, name, parse_bytes(model["weightsBytes"]), parse_bytes(kv) if kv else 0)


def wait_for(probe: Callable[[], Any], timeout_seconds: float, what: str) -> Any:
    """Call `probe` until it returns something truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


# -- the models -------------------------------------------------------------------------------


def make_big_model(root: Path, weights_bytes: int) -> Path:
    """A python-backend model whose weight file is `weights_bytes` (the MLP's weights tiled:
    the answers are the MLP's), under `root/big`."""
    folder = root / "big"
    (folder / "1").mkdir(parents=True)
    shutil.copy(BIG_MODEL, folder / "1" / "model.py")
    data = (TOY_DIRS["mlp"] / "1" / "weights.f32").read_bytes()
    with (folder / "1" / "weights.f32").open("wb") as f:
        block = reference.tiled(data, 64 * MIB - (64 * MIB) % len(data))
        written = 0
        while written < weights_bytes:
            # each block starts at a multiple of the file's length, so the tiling continues
            n = min(len(block), weights_bytes - written)
            f.write(block[:n])
            written += n
    config = (TOY_DIRS["mlp"] / "config.pbtxt").read_text()
    config = "\n".join(
        line
        for line in config.splitlines()
        if "weights_file" not in line and "min_weights_bytes" not in line
    )
    (folder / "config.pbtxt").write_text(config + "\n")
    return folder


def big_checksum(weights_bytes: int) -> int:
    """What the big model answers as CHECKSUM: the sampled CRC of its tiled weights."""
    data = (TOY_DIRS["mlp"] / "1" / "weights.f32").read_bytes()
    page, pages, samples = 4096, weights_bytes // 4096, 64
    crc = 0
    for i in range(samples):
        p = (pages - 1) * i // (samples - 1)
        start = p * page
        # bytes [start, start + page) of the tiling: rotate the file to `start`
        offset = start % len(data)
        crc = zlib.crc32(reference.tiled(data[offset:] + data[:offset], page), crc)
    return crc


def deployment(case: ModelCase, swap_policy: dict[str, Any] | None = None) -> dict[str, Any]:
    model: dict[str, Any] = {
        "name": case.name,
        "runtime": "triton",
        "source": {"uri": f"/models/{case.source}"},
        "weightsBytes": str(case.weights_bytes),
    }
    spec: dict[str, Any] = {
        "model": model,
        # the bench decides every swap: nothing swaps out on its own
        "swapPolicy": swap_policy or {"idleAfter": "never", "priority": 100, "onSwapOut": "host"},
    }
    if case.kv_bytes:
        model["kvCacheBytes"] = str(case.kv_bytes)
        spec["kvCache"] = {"offloadAfterTokens": 4096, "hostBytes": "4Mi"}
    return {
        "apiVersion": "modelswap.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": case.name, "namespace": "default"},
        "spec": spec,
    }


# -- checked calls ----------------------------------------------------------------------------

MLP_INPUT = reference.mlp_input(7)
TINYLM_PROMPT = [1, 2, 3, 4]
#: one embed request: two texts of different lengths (so one is padded)
EMBED_TEXTS = ("modelswap pages idle models out of GPU memory", "hello world")
#: embeddings may differ from plain transformers' by this much (max abs difference)
EMBED_TOLERANCE = 1e-6
#: one tinyllama request: greedy, this many tokens (equal to transformers' generate)
TINYLLAMA_PROMPT = "modelswap pages idle models"
TINYLLAMA_MAX_TOKENS = 8


class NoAnswerError(AssertionError):
    """The model did not answer (an error status: not loaded yet, loading, its stub gone)."""


class WrongAnswerError(AssertionError):
    """The model answered, and the answer is wrong."""


@functools.cache
def embed_expected() -> tuple[np.ndarray, np.ndarray]:
    """What embed answers for EMBED_TEXTS: plain transformers on the packaged weights in
    this process (computed once, before anything is timed)."""
    return reference.embed_texts(EMBED_TEXTS)


@functools.cache
def tinyllama_expected() -> list[int]:
    """The token ids tinyllama answers for TINYLLAMA_PROMPT: plain transformers' greedy
    generate on the example's weights in this process (computed once)."""
    return reference.tinyllama_tokens(TINYLLAMA_PROMPT, TINYLLAMA_MAX_TOKENS)


def expect(cases: list[ModelCase]) -> None:
    """Compute every reference answer `cases` are checked against now, so none is computed
    (plain transformers loading a model) inside a timed call."""
    for case in cases:
        if case.source == "embed":
            embed_expected()
        elif case.source == "tinyllama":
            tinyllama_expected()


def check_answer(client: httpx.Client, case: ModelCase, triton_name: str) -> None:
    """One request to `triton_name` (at `client`'s base URL); raise NoAnswerError on an error
    status, WrongAnswerError unless the answer is what plain transformers (real models) or
    examples/models/reference.py (the toys) computes for `case`."""
    if case.source == "embed":
        _check_embed(client, case, triton_name)
        return
    if case.source == "tinyllama":
        _check_tinyllama(client, case, triton_name)
        return
    if case.source == "tinylm":
        url = f"/v2/models/{triton_name}/generate_stream"
        body = {"PROMPT": TINYLM_PROMPT, "MAX_TOKENS": 1}
        events = []
        with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                raise NoAnswerError(f"{case.name}: {r.status_code} {r.read()!r}")
            for line in r.iter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
        want = reference.tinylm_generate(TINYLM_PROMPT, 1)[0]
        got = events[-1] if events else {}
        checksum = reference.tinylm_checksum(case.weights_bytes)
        if got.get("TOKEN") != want.token or got.get("CHECKSUM") != checksum:
            raise WrongAnswerError(f"{case.name}: wrong answer {got}")
        return
    r = client.post(f"/v2/models/{triton_name}/infer", json=reference.mlp_infer_body(MLP_INPUT))
    if r.status_code != 200:
        raise NoAnswerError(f"{case.name}: {r.status_code} {r.text}")
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    out = np.array(outputs["OUTPUT0"]["data"], dtype=np.float64).reshape(-1, 8)
    want_checksum = (
        big_checksum(case.weights_bytes)
        if case.source == "big"
        else reference.mlp_checksum(case.weights_bytes)
    )
    if not np.allclose(out, reference.mlp_forward(MLP_INPUT), rtol=1e-4, atol=1e-4):
        raise WrongAnswerError(f"{case.name}: wrong outputs")
    if int(outputs["CHECKSUM"]["data"][0]) != want_checksum:
        raise WrongAnswerError(f"{case.name}: wrong checksum")


def _check_tinyllama(client: httpx.Client, case: ModelCase, triton_name: str) -> None:
    url = f"/v2/models/{triton_name}/generate_stream"
    body = {"text_input": TINYLLAMA_PROMPT, "parameters": {"max_tokens": TINYLLAMA_MAX_TOKENS}}
    tokens: list[int] = []
    with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise NoAnswerError(f"{case.name}: {r.status_code} {r.read()!r}")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:  # the stream began, the model failed: no answer
                raise NoAnswerError(f"{case.name}: {event['error']}")
            ids = event["token_ids"]  # Triton writes a one-element tensor as a number
            tokens += ids if isinstance(ids, list) else [ids]
    if tokens != tinyllama_expected():
        raise WrongAnswerError(f"{case.name}: tokens {tokens}, not {tinyllama_expected()}")


def _check_embed(client: httpx.Client, case: ModelCase, triton_name: str) -> None:
    r = client.post(f"/v2/models/{triton_name}/infer", json=reference.embed_infer_body(EMBED_TEXTS))
    if r.status_code != 200:
        raise NoAnswerError(f"{case.name}: {r.status_code} {r.text}")
    rows, tokens = reference.embed_outputs(r.json())
    want_rows, want_tokens = embed_expected()
    if rows.shape != want_rows.shape:
        raise WrongAnswerError(f"{case.name}: embeddings {rows.shape}, not {want_rows.shape}")
    difference = float(np.max(np.abs(rows - want_rows)))
    if difference > EMBED_TOLERANCE:
        raise WrongAnswerError(f"{case.name}: embeddings differ by up to {difference:.3g}")
    if tokens.tolist() != want_tokens.tolist():
        raise WrongAnswerError(f"{case.name}: prompt_tokens {tokens.tolist()}")


# -- modelswap up -----------------------------------------------------------------------------


@dataclass
class LocalNode:
    state: dict[str, Any]
    token: str
    uids: dict[str, str]  # deployment name -> uid
    control: httpx.Client
    triton: httpx.Client
    gateway: httpx.Client
    log_path: Path | None = None  # `modelswap up`'s output (agent, Triton and its stubs)

    def triton_name(self, name: str) -> str:
        return triton_model_name(self.uids[name])

    def triton_pid(self) -> int | None:
        """The running tritonserver's pid (the supervisor's state file), None when none."""
        try:
            state = json.loads((Path(self.state["runDir"]) / "supervisor.json").read_text())
        except (OSError, ValueError):
            return None
        child = state.get("children", {}).get("runtime", {})
        pid = child.get("pid")
        return int(pid) if child.get("running") and pid else None

    def stub_pids(self, name: str) -> list[int]:
        """The python-backend stub processes serving model `name` now."""
        triton = self.triton_pid()
        return [] if triton is None else descendant_stub_pids(triton, self.triton_name(name))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def models(self) -> dict[str, dict[str, Any]]:
        r = self.control.get("/v1/models")
        r.raise_for_status()
        return {m["name"]: m for m in r.json()["models"]}

    def swap(self, name: str, direction: str) -> dict[str, Any]:
        r = self.control.post(f"/v1/models/{self.uids[name]}/swap-{direction}")
        r.raise_for_status()
        found: dict[str, Any] = r.json()
        return found

    def wait_state(self, name: str, state: str, timeout_seconds: float = 120.0) -> None:
        wait_for(
            lambda: self.models().get(name, {}).get("state") == state,
            timeout_seconds,
            f"{name} {state}",
        )

    def metric(self, name: str, labels: dict[str, str]) -> float:
        """One sample of the agent's /metrics (0 when absent)."""
        text = httpx.get(self.state["metricsUrl"], trust_env=False, timeout=30).text
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


def _client(base_url: str, token: str = "") -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=base_url, headers=headers, timeout=300, trust_env=False)


def _stop_group(proc: subprocess.Popen[bytes], sig: int, timeout_seconds: float) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def local_node(
    cases: list[ModelCase],
    workdir: Path,
    sim_gpu_bytes: int,
    model_root: Path,
    *,
    pace_gbps: float | None = None,
    swap_policy: dict[str, Any] | None = None,
    all_resident: bool = True,
) -> Iterator[LocalNode]:
    """`modelswap up` serving `cases` (all resident when this yields, or with
    `all_resident=False` all loaded, resident or swapped out, when they cannot all fit);
    stopped with SIGINT (what Ctrl-C does), which removes its shm regions, store and
    sockets. `pace_gbps`: the node's copy pacing (`--pace-gbps`); `swap_policy`: every
    deployment's swapPolicy (default: nothing swaps out by itself)."""
    folder, run_dir = workdir / "deployments", workdir / "run"
    folder.mkdir()
    for case in cases:
        (folder / f"{case.name}.yaml").write_text(yaml.safe_dump(deployment(case, swap_policy)))
    command = [
        sys.executable, "-m", "modelswap_api.cli", "up", "-f", str(folder),
        "--model-root", str(model_root), "--run-dir", str(run_dir), "--port", "0",
        "--allocator", "sim", "--sim-gpu-bytes", str(sim_gpu_bytes), "--log-level", "warning",
    ]  # fmt: skip
    if pace_gbps is not None:
        command += ["--pace-gbps", str(pace_gbps)]
    settled = ("Resident",) if all_resident else ("Resident", "SwappedOut")
    log = (workdir / "up.log").open("wb")
    up = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
    )
    clients: list[httpx.Client] = []
    try:

        def started() -> dict[str, Any] | None:
            if up.poll() is not None:
                raise RuntimeError(f"modelswap up exited: {(workdir / 'up.log').read_text()}")
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                found: dict[str, Any] = json.loads((run_dir / "local.json").read_text())
                return found if found.get("running") else None
            return None

        state = wait_for(started, 90, "modelswap up")
        token = Path(state["tokenFile"]).read_text().strip()
        clients = [
            _client(state["controlUrl"], token),
            _client(state["tritonUrl"]),
            _client(state["gatewayUrl"]),
        ]
        control, triton, gateway = clients
        node = LocalNode(state, token, {}, control, triton, gateway, workdir / "up.log")

        def all_settled() -> bool:
            try:  # local.json is written before the agent listens
                models = node.models()
            except httpx.HTTPError:
                return False
            return all(models.get(c.name, {}).get("state") in settled for c in cases)

        try:
            wait_for(all_settled, 180, "every model resident")
        except TimeoutError:
            tail = (workdir / "up.log").read_text(errors="replace")[-3000:]
            raise TimeoutError(f"models not resident: {node.models()}\n{tail}") from None
        node.uids = {name: m["uid"] for name, m in node.models().items()}
        yield node
    finally:
        for c in clients:
            c.close()
        _stop_group(up, signal.SIGINT, 60)
        log.close()


# -- a plain Triton: what users run today -----------------------------------------------------


@dataclass
class PlainTriton:
    client: httpx.Client

    def load(self, name: str) -> None:
        r = self.client.post(f"/v2/repository/models/{name}/load")
        if r.status_code != 200:
            raise RuntimeError(f"load {name}: {r.status_code} {r.text}")

    def unload(self, name: str) -> None:
        r = self.client.post(f"/v2/repository/models/{name}/unload")
        if r.status_code != 200:
            raise RuntimeError(f"unload {name}: {r.status_code} {r.text}")
        # the unload call returns before the model's stub is gone: wait until it is
        wait_for(
            lambda: (
                not any(
                    m.get("name") == name and m.get("state") in ("READY", "UNLOADING")
                    for m in self.client.post("/v2/repository/index").json()
                )
            ),
            120,
            f"{name} unloaded",
        )


def _preamble() -> str:
    import modelswap_client  # noqa: PLC0415 - only to name the real package's folder

    shim = Path(__file__).resolve().parent / "standalone"
    real = Path(modelswap_client.__file__).resolve().parent
    # the stub imports modelswap_client from its own path (its embedded interpreter
    # ignores PYTHONPATH): put the stand-in first
    return (
        "import os as _os, sys as _sys\n"
        f"_os.environ['MODELSWAP_REAL_CLIENT'] = {str(real)!r}\n"
        f"_sys.path.insert(0, {str(shim)!r})\n"
        "for _k in [k for k in _sys.modules if k.split('.')[0] == 'modelswap_client']:\n"
        "    del _sys.modules[_k]\n"
    )


def with_stand_in(source: str) -> str:
    """A model.py's code with the stand-in's preamble first: after its `from __future__`
    imports, which must open a module."""
    after = 0
    for statement in ast.parse(source).body:
        if isinstance(statement, ast.ImportFrom) and statement.module == "__future__":
            after = statement.end_lineno or statement.lineno
    lines = source.splitlines(keepends=True)
    return "".join(lines[:after]) + _preamble() + "".join(lines[after:])


@contextlib.contextmanager
def plain_triton(cases: list[ModelCase], workdir: Path, model_root: Path) -> Iterator[PlainTriton]:
    """A tritonserver (explicit model control) with `plain-<name>` copies of the models
    (the same files, linked), whose `modelswap_client.client.attach` is the in-process
    stand-in (bench/standalone): each load reads the weights from the model's files (a
    Hugging Face model: `modelswap_client.torch.from_pretrained` from its safetensors, as
    the attachment is never restored), as without modelswap."""
    repo = workdir / "plain-repository"
    repo.mkdir()
    for case in cases:
        folder = repo / f"plain-{case.name}"
        (folder / "1").mkdir(parents=True)
        source = model_root / case.source / "1"
        for item in source.iterdir():
            if item.name == "model.py":  # the same code behind the stand-in client
                (folder / "1" / "model.py").write_text(with_stand_in(item.read_text()))
            elif item.is_file():
                (folder / "1" / item.name).symlink_to(item.resolve())
        config = (model_root / case.source / "config.pbtxt").read_text()
        params = {"modelswap.weights_bytes": case.weights_bytes, "modelswap.agent_socket": "none"}
        if case.kv_bytes:
            params["modelswap.kv_cache_bytes"] = case.kv_bytes
        config += "".join(
            f'\nparameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
            for k, v in params.items()
        )
        (folder / "config.pbtxt").write_text(config + "\n")
    settings = TritonSettings(binary=TRITONSERVER, model_repository=repo)
    ports = TritonPorts(http=free_loopback_port(), grpc=free_loopback_port(), metrics=None)
    prefix = new_shm_prefix()
    log = (workdir / "plain-triton.log").open("wb")
    proc = subprocess.Popen(
        triton_command(settings, ports, shm_prefix=prefix),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    client = _client(f"http://127.0.0.1:{ports.http}")
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"plain Triton exited: {(workdir / 'plain-triton.log').read_text()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                return client.get("/v2/health/ready").status_code == 200
            return False

        wait_for(ready, 60, "plain Triton ready")
        yield PlainTriton(client)
    finally:
        client.close()
        _stop_group(proc, signal.SIGTERM, 20)
        log.close()
        remove_shm_regions(prefix)


#: the `model_dir` parameter of a real example's config.pbtxt (its Hugging Face folder)
_MODEL_DIR_PARAMETER = re.compile(
    r'parameters\s*\{\s*key:\s*"model_dir"\s*value:\s*\{\s*string_value:\s*"[^"]*"\s*\}\s*\}'
)


def hf_source(name: str) -> Path:
    """The Hugging Face folder (config, safetensors, tokenizer) real example `name` loads."""
    if name == "embed":
        return reference.minilm_dir()
    if name == "tinyllama":
        return reference.TINYLLAMA_DIR
    raise ValueError(f"no Hugging Face folder known for {name!r}")


def hf_folder(root: Path, name: str) -> Path:
    """Where `model_root` put real model `name`'s own copy of its Hugging Face folder."""
    return root / "hf" / name


def add_real_model(root: Path, name: str) -> Path:
    """A copy of examples/models/<name> under `root`, its Hugging Face folder copied to
    `hf_folder(root, name)` (outside the model's folder, which local mode watches for
    changes) and named by the copy's `model_dir` parameter: the bench moves and touches
    those weight files without touching the example's."""
    folder = root / name
    shutil.copytree(EXAMPLES / name, folder, ignore=shutil.ignore_patterns("__pycache__"))
    hf = hf_folder(root, name)
    shutil.copytree(hf_source(name), hf, ignore=shutil.ignore_patterns("__pycache__"))
    config = folder / "config.pbtxt"
    text = config.read_text()
    line = f'parameters {{ key: "model_dir" value: {{ string_value: {json.dumps(str(hf))} }} }}'
    text, found = _MODEL_DIR_PARAMETER.subn(lambda _: line, text)
    if found != 1:
        raise ValueError(f"{EXAMPLES / name / 'config.pbtxt'}: no model_dir parameter to set")
    config.write_text(text)
    return folder


@contextlib.contextmanager
def model_root(big_bytes: int, real: tuple[str, ...] = ()) -> Iterator[Path]:
    """A temporary model root: the toy example models (linked), the generated big model
    when `big_bytes`, and a copy of each real example model in `real` (`add_real_model`);
    removed after."""
    with scratch.directory("modelswap-bench-models-") as tmp:
        for name, folder in TOY_DIRS.items():
            (tmp / name).symlink_to(folder)
        if big_bytes:
            make_big_model(tmp, big_bytes)
        for name in real:
            add_real_model(tmp, name)
        yield tmp
