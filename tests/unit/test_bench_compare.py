"""The pieces of `bench.compare` that decide its real-model figures, without Triton: the
stand-in client under `modelswap_client.torch` (the cold baseline's Hugging Face load),
the plain Triton's model.py rewrite, the model root's copy of a real example, the checked
answers, and the restore timing after a kill."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bench import compare, local_node
from bench.local_node import ModelCase, NoAnswerError, WrongAnswerError
from examples.models import reference

pytestmark = pytest.mark.timeout(120)
MIB = 1 << 20
EMBED = ModelCase("embed", "embed", 87 * MIB)
TINYLLAMA = ModelCase("tinyllama", "tinyllama", 3 * MIB)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """`modelswap_client` as a plain Triton's stub sees it: the stand-in package first,
    every other module the real one. Yields the package; the real one is back after."""
    import modelswap_client

    monkeypatch.setenv("MODELSWAP_REAL_CLIENT", str(Path(modelswap_client.__file__).parent))
    monkeypatch.syspath_prepend(str(Path(local_node.__file__).parent / "standalone"))
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "modelswap_client"}
    for k in saved:
        del sys.modules[k]
    try:
        package = importlib.import_module("modelswap_client")
        assert "standalone" in str(importlib.import_module("modelswap_client.client").__file__)
        yield package
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] == "modelswap_client"]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.mark.slow
def test_the_stand_in_loads_a_hugging_face_model_from_its_files_as_without_modelswap(
    stand_in: Any,
) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    triton = importlib.import_module("modelswap_client.triton")
    mstorch = importlib.import_module("modelswap_client.torch")
    config = {
        "parameters": {
            "modelswap.weights_bytes": {"string_value": str(3 * MIB)},
            "modelswap.agent_socket": {"string_value": "none"},
        }
    }
    args = {"model_config": json.dumps(config), "model_name": "plain-tinyllama"}
    att = triton.attach_model(args)
    try:
        assert type(att).__module__ == "modelswap_client.client"  # the stand-in's
        model = mstorch.from_pretrained(att, AutoModelForCausalLM, reference.TINYLLAMA_DIR)
        # never restored: the weights came from the files, and were "committed"
        assert not att.restored and att.committed and att.fingerprint.startswith("v1;")
        region = att.regions["weights"]
        start, end = region.address, region.address + region.size_bytes
        for name, p in model.named_parameters():
            assert start <= p.data_ptr() < end, f"{name} is not in the region"
        plain = AutoModelForCausalLM.from_pretrained(reference.TINYLLAMA_DIR).eval()
        ids = torch.tensor([[1, 5, 9, 200, 17]])
        with torch.inference_mode():
            assert torch.equal(model(ids).logits, plain(ids).logits)
    finally:
        att.close()


def stub_phases_module() -> Any:
    """bench/standalone/stub_phases.py as a module (importing it runs nothing)."""
    path = Path(local_node.__file__).parent / "standalone" / "stub_phases.py"
    spec = importlib.util.spec_from_file_location("stub_phases", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_binding_is_timed_only_when_the_host_copy_binds(stand_in: Any) -> None:
    pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    client = importlib.import_module("modelswap_client.client")
    mstorch = importlib.import_module("modelswap_client.torch")
    phases = stub_phases_module()
    fresh = client.attach("fresh", [client.RegionSpec("weights", 3 * MIB)])
    try:
        mstorch.from_pretrained(fresh, AutoModelForCausalLM, reference.TINYLLAMA_DIR)
        seconds = phases.timed_bind(
            client, mstorch, AutoModelForCausalLM, reference.TINYLLAMA_DIR, fresh
        )
        assert 0 < seconds < 60
        # bytes committed by another layout: from_pretrained loads afresh, which is no bind
        fresh.fingerprint = "v1;layout=another;source="
        with pytest.raises(RuntimeError, match="did not bind"):
            phases.timed_bind(client, mstorch, AutoModelForCausalLM, reference.TINYLLAMA_DIR, fresh)
    finally:
        fresh.close()


@pytest.mark.slow
def test_a_new_stub_s_phases_are_measured_in_the_stub_environment() -> None:
    if not compare.STUB_PYTHON.exists():
        pytest.skip("no stub environment (.venv-triton): make setup")
    figures = compare._stub_phases(TINYLLAMA, reference.TINYLLAMA_DIR)
    assert set(figures) == set(compare.STUB_PHASE_ROWS.values())
    assert all(0 < v < 120 for v in figures.values()), figures
    too_small = ModelCase("tinyllama", "tinyllama", 64 * 1024)
    with pytest.raises(
        RuntimeError, match=r"(?s)stub_phases\.py failed.*weightsBytes to at least 3Mi"
    ):
        compare._stub_phases(too_small, reference.TINYLLAMA_DIR)


def test_the_plain_model_py_imports_the_stand_in_after_its_future_imports() -> None:
    source = '"""doc"""\nfrom __future__ import annotations\n\nimport os\nX = 1\n'
    rewritten = local_node.with_stand_in(source)
    body = ast.parse(rewritten).body  # still valid Python: __future__ first
    assert isinstance(body[1], ast.ImportFrom) and body[1].module == "__future__"
    assert rewritten.index("from __future__") < rewritten.index("_sys.path.insert(0")
    assert rewritten.index("_sys.path.insert(0") < rewritten.index("import os\n")
    assert str(Path(local_node.__file__).parent / "standalone") in rewritten
    # without a __future__ import the stand-in comes first
    assert local_node.with_stand_in("import os\n").startswith("import os as _os, sys as _sys")


def test_a_real_model_is_copied_with_its_own_hugging_face_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = tmp_path / "examples" / "tinyllama"
    (example / "1").mkdir(parents=True)
    (example / "1" / "model.py").write_text("# model\n")
    config = 'backend: "python"\nparameters { key: "model_dir" value: { string_value: "1/hf" } }\n'
    (example / "config.pbtxt").write_text(config)
    hf = tmp_path / "hf-source"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"w")
    monkeypatch.setattr(local_node, "EXAMPLES", tmp_path / "examples")
    monkeypatch.setattr(local_node, "hf_source", lambda name: hf)
    root = tmp_path / "root"
    root.mkdir()
    folder = local_node.add_real_model(root, "tinyllama")
    copy = local_node.hf_folder(root, "tinyllama")
    assert (copy / "model.safetensors").read_bytes() == b"w"
    assert not copy.is_relative_to(folder)  # local mode watches the model's folder, not this
    text = (folder / "config.pbtxt").read_text()
    assert f'string_value: "{copy}"' in text and "1/hf" not in text
    assert (example / "config.pbtxt").read_text() == config  # the example is untouched

    (example / "config.pbtxt").write_text('backend: "python"\n')
    with pytest.raises(ValueError, match="no model_dir parameter"):
        local_node.add_real_model(tmp_path / "other", "tinyllama")


def test_real_cases_take_their_sizes_from_the_examples_deployments() -> None:
    embed, tinyllama = compare.cases(0, ("embed", "tinyllama"))
    assert embed.real and tinyllama.real
    assert embed.weights_bytes >= 80 * MIB  # all-MiniLM-L6-v2's 22.7 M float32 parameters
    assert 0 < tinyllama.weights_bytes < 16 * MIB
    assert [c.name for c in compare.cases(0)] == ["mlp", "tinylm", "embed", "tinyllama"]


def test_an_unknown_model_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        compare.main(["--models", "embed,llama70b", "--no-results"])
    assert exited.value.code == 2
    assert "unknown models ['llama70b']" in capsys.readouterr().err


# -- checked answers ----------------------------------------------------------------------


def client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(base_url="http://node", transport=httpx.MockTransport(handler))


ROWS = np.array([[0.5, -0.25], [0.125, 1.0]], dtype=np.float32)


def embed_answer(rows: np.ndarray, tokens: list[int]) -> dict[str, Any]:
    return {
        "outputs": [
            {"name": "embedding", "shape": list(rows.shape), "data": rows.ravel().tolist()},
            {"name": "prompt_tokens", "shape": [len(tokens)], "data": tokens},
        ]
    }


@pytest.fixture
def expected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reference answers without running transformers."""
    monkeypatch.setattr(
        local_node, "embed_expected", lambda: (ROWS, np.array([9, 4], dtype=np.int64))
    )
    monkeypatch.setattr(local_node, "tinyllama_expected", lambda: [5, 6, 7])


@pytest.mark.usefixtures("expected")
def test_embed_answers_are_judged_against_transformers_within_the_tolerance() -> None:
    def answering(rows: np.ndarray, tokens: list[int]) -> httpx.Client:
        def handler(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            assert body["inputs"][0]["data"] == list(local_node.EMBED_TEXTS)
            return httpx.Response(200, json=embed_answer(rows, tokens))

        return client(handler)

    local_node.check_answer(answering(ROWS + 5e-7, [9, 4]), EMBED, "m")
    with pytest.raises(WrongAnswerError, match="differ by up to"):
        local_node.check_answer(answering(ROWS + 1e-5, [9, 4]), EMBED, "m")
    with pytest.raises(WrongAnswerError, match="prompt_tokens"):
        local_node.check_answer(answering(ROWS, [9, 5]), EMBED, "m")
    with pytest.raises(WrongAnswerError, match="embeddings"):
        local_node.check_answer(answering(ROWS[:1], [9]), EMBED, "m")
    refusing = client(lambda r: httpx.Response(503, json={"error": "embed is pending"}))
    with pytest.raises(NoAnswerError, match="503"):
        local_node.check_answer(refusing, EMBED, "m")


def sse(*events: dict[str, Any]) -> httpx.Response:
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
    return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


@pytest.mark.usefixtures("expected")
def test_tinyllama_answers_are_its_streamed_greedy_tokens() -> None:
    def streaming(*events: dict[str, Any]) -> httpx.Client:
        def handler(request: httpx.Request) -> httpx.Response:
            assert request.url.path == "/v2/models/m/generate_stream"
            body = json.loads(request.content)
            assert body["text_input"] == local_node.TINYLLAMA_PROMPT
            assert body["parameters"] == {"max_tokens": local_node.TINYLLAMA_MAX_TOKENS}
            return sse(*events)

        return client(handler)

    # a one-token event's token_ids arrive as a number
    local_node.check_answer(streaming({"token_ids": [5, 6]}, {"token_ids": 7}), TINYLLAMA, "m")
    with pytest.raises(WrongAnswerError, match=r"tokens \[5, 6, 8\]"):
        local_node.check_answer(streaming({"token_ids": [5, 6, 8]}), TINYLLAMA, "m")
    with pytest.raises(NoAnswerError, match="stub died"):
        local_node.check_answer(
            streaming({"token_ids": [5]}, {"error": "stub died"}), TINYLLAMA, "m"
        )
    with pytest.raises(NoAnswerError, match="400"):
        local_node.check_answer(client(lambda r: httpx.Response(400)), TINYLLAMA, "m")


# -- the restore after a kill ---------------------------------------------------------------


class FakeNode:
    """A node whose one stub is a real process: killing it makes the model leave Resident,
    and the gateway refuses `refusals` requests before it answers (or refuses forever)."""

    def __init__(self, gateway: Callable[[httpx.Request], httpx.Response]) -> None:
        self.stubs = [subprocess.Popen(["sleep", "60"])]
        self.gateway = client(gateway)

    def stub_pids(self, name: str) -> list[int]:
        return [p.pid for p in self.stubs if p.poll() is None]

    def models(self) -> dict[str, dict[str, Any]]:
        return {"tinyllama": {"state": "Resident" if self.stub_pids("") else "Loading"}}

    def log(self) -> str:
        return ""

    def close(self) -> None:
        for p in self.stubs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()


@pytest.mark.usefixtures("expected")
def test_the_restore_is_timed_from_the_kill_to_the_first_correct_answer() -> None:
    node: FakeNode
    asked: list[int] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        asked.append(len(node.stub_pids("")))
        if len(asked) < 3:
            return httpx.Response(503, json={"error": "pending"})
        node.stubs.append(subprocess.Popen(["sleep", "60"]))  # the new stub
        return sse({"token_ids": [5, 6, 7]})

    node = FakeNode(gateway)
    killed = node.stubs[0]
    try:
        seconds = compare._kill_to_answer(node, TINYLLAMA)
        assert killed.wait(timeout=10) == -signal.SIGKILL
        assert asked[0] == 0  # the first request went out after the stub had died
        assert len(asked) == 3 and 2 * compare.POLL_SECONDS <= seconds < 30
    finally:
        node.close()


@pytest.mark.usefixtures("expected")
def test_a_model_that_never_comes_back_fails_the_bench_at_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compare, "RECOVERY_LIMIT_SECONDS", 0.3)
    node = FakeNode(lambda r: httpx.Response(503, json={"error": "pending"}))
    try:
        with pytest.raises(TimeoutError, match="did not answer 0 s after its stub was killed"):
            compare._kill_to_answer(node, TINYLLAMA)
    finally:
        node.close()


@pytest.mark.usefixtures("expected")
def test_a_wrong_answer_after_the_kill_is_not_waited_out() -> None:
    node = FakeNode(lambda r: sse({"token_ids": [1, 2, 3]}))
    try:
        with pytest.raises(WrongAnswerError):
            compare._kill_to_answer(node, TINYLLAMA)
    finally:
        node.close()


def test_two_stubs_for_one_model_are_refused_before_any_kill() -> None:
    node = FakeNode(lambda r: httpx.Response(500))
    node.stubs.append(subprocess.Popen(["sleep", "60"]))
    try:
        with pytest.raises(RuntimeError, match="2 stub processes"):
            compare._kill_to_answer(node, TINYLLAMA)
        assert all(p.poll() is None for p in node.stubs)  # nothing was killed
    finally:
        node.close()


def restore_rows(restore: list[float], fresh: list[float], load: float) -> list[dict[str, Any]]:
    from bench import results_schema

    params = {"model": "embed", "model_bytes": 87 * MIB, "reps": len(restore)}
    metrics = {
        "speedup_vs_fresh_load": float(np.median(fresh) / np.median(restore)),
        "stub_imports_seconds": 4.0,
        "stub_first_build_seconds": 3.0,
        "stub_load_from_files_seconds": load,
        "stub_bind_host_copy_seconds": 0.05,
    }
    return [
        results_schema.result("restore_after_kill_to_answer", params, restore, **metrics),
        results_schema.result("fresh_load_after_kill_to_answer", params, fresh),
    ]


def test_the_restore_note_weighs_the_host_copy_s_saving_against_the_restart_s_spread() -> None:
    note = compare._restore_note(restore_rows([14.0, 15.0, 19.0], [15.5, 16.0, 13.0], 0.85))
    assert note.startswith("embed: restore after a kill 15.00 s vs fresh load 15.50 s (1.03x)")
    assert "4.00 s importing torch and transformers and 3.00 s on the model's first build" in note
    assert "0.850 s loading the files vs 0.050 s binding the host copy" in note
    assert "saves about 0.80 s (5% of the fresh load)" in note
    assert (
        "less than one path's repetitions differ here (restore 14.0 to 19.0 s, fresh load "
        "13.0 to 16.0 s)" in note
    )
    # a saving larger than the noise is stated without the comparison to it
    clear = compare._restore_note(restore_rows([5.0, 5.1, 5.2], [9.0, 9.1, 9.2], 4.05))
    assert "(1.78x)" in clear and "4.050 s loading the files vs 0.050 s" in clear
    assert "repetitions differ" not in clear
