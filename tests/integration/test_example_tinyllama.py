"""The `tinyllama` example (examples/models/tinyllama): a Llama-architecture Hugging Face model
with random weights from a fixed seed and a byte-level tokenizer, in a Triton python
backend through `modelswap_client.torch`, decoupled on Triton's generate extension.

Every answer is compared with the same folder run by plain transformers in this process:
greedy tokens equal `generate(do_sample=False)`, seeded sampling equals `generate(
do_sample=True, ...)` after `torch.manual_seed(seed)`. Without Triton, the example's
model.py runs in this process (a stand-in for `triton_python_backend_utils` and for the
attachment); with Triton, local mode serves it on a sim GPU and the answers come through
the gateway (v2 `generate_stream`, OpenAI completions and chat, streamed and not), before
and after a manual swap-out with a request-triggered swap-in, and an idle swap-out.
The committed weight files are what examples/models/make_weights.py writes, byte for byte.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import json
import re
import subprocess
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from examples.models import make_weights
from modelswap_api.quantities import format_bytes
from modelswap_sidecar.gateway.openai import chat_prompt
from tests.support.local_up import LocalNode, local_up
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"
MODEL_DIR = MODELS / "tinyllama"
HF_DIR = MODEL_DIR / "1" / "hf"
EXAMPLE_YAML = ROOT / "examples" / "tinyllama.yaml"
EOS = make_weights.EOS_ID
CONTEXT = make_weights.TINYLLAMA_CONFIG["max_position_embeddings"]
#: The torch import and the model load in the stub take 15-30 s on a busy 2-core machine.
LOAD_SECONDS = 240
MAX_TOKENS = 24
#: Texts that reach the model as they are (completions), ASCII and not; "" is BOS alone.
PROMPTS = ("The quick brown fox", "modelswap pages idle models out", "Ünïcødé ✓ 漢字", "")
#: Greedy ends at EOS after 5 tokens (checked against the reference below).
EOS_PROMPT = "stop there"
CHATS: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "user", "content": "hi"},),
    ({"role": "system", "content": "be brief"}, {"role": "user", "content": "swap me in"}),
)
#: (temperature, top_k, top_p, seed): sampling as transformers' generate does it.
SAMPLINGS = ((0.8, 0, 1.0, 1), (1.0, 5, 1.0, 2), (0.7, 0, 0.9, 3), (1.3, 20, 0.8, 2**40))


# -- the reference: plain transformers on the same folder ----------------------------------------


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's CPU threads set to `n` (as the served model sets them), then restored."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Reference:
    """The example's folder loaded by plain transformers; answers cached by request."""

    def __init__(self, folder: Path = HF_DIR) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        model: Any = AutoModelForCausalLM.from_pretrained(folder)
        self.model: Any = model.eval()
        self._answers: dict[tuple[Any, ...], list[int]] = {}

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def chat_text(self, messages: Sequence[dict[str, str]]) -> str:
        """What the gateway's chat route sends the model as text_input."""
        return chat_prompt(list(messages))

    def tokens(
        self,
        text: str,
        max_tokens: int = MAX_TOKENS,
        sampling: tuple[float, int, float, int] | None = None,
    ) -> list[int]:
        """`generate`'s new tokens for `text` (EOS included when it ends there)."""
        key = (text, max_tokens, sampling)
        if key not in self._answers:
            import torch

            ids = torch.tensor([self.ids(text)])
            options: dict[str, Any] = {"do_sample": False}
            if sampling is not None:
                temperature, top_k, top_p, seed = sampling
                options = {"do_sample": True, "temperature": temperature, "top_k": top_k}
                options["top_p"] = top_p
                torch.manual_seed(seed)
            with torch_threads(1), torch.inference_mode():
                out = self.model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_tokens,
                    **options,
                )
            self._answers[key] = out[0, ids.shape[1] :].tolist()
        return self._answers[key]

    def text(self, tokens: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=True))


@pytest.fixture(scope="module")
def reference() -> Reference:
    return Reference()


@dataclass
class Answer:
    """One generation as the model streamed it."""

    pieces: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def finish_of(tokens: Sequence[int], max_tokens: int) -> str:
    return "stop" if tokens and tokens[-1] == EOS else "length"


# -- the example's model.py in this process ------------------------------------------------------


class _InputTensor:
    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def as_numpy(self) -> np.ndarray:
        return self.value


class _Tensor:
    def __init__(self, name: str, value: np.ndarray) -> None:
        self.name, self.value = name, value


class _TritonError:
    INVALID_ARG = 3

    def __init__(self, message: str, code: int | None = None) -> None:
        self._message, self.code = message, code

    def message(self) -> str:
        return self._message


class _Response:
    def __init__(self, output_tensors: list[_Tensor] | None = None, error: Any = None) -> None:
        self.outputs = {t.name: t.value for t in output_tensors or []}
        self.error = error


class _Attachment:
    """Counts how deep in `in_use()` the model is (what the agent's gate would hold)."""

    def __init__(self) -> None:
        self.depth = 0
        self.entered = 0
        self.closed = False
        self.lock = threading.Lock()
        self.regions: dict[str, Any] = {}  # no KV region: no sessions

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        with self.lock:
            self.depth += 1
            self.entered += 1
        try:
            yield
        finally:
            with self.lock:
                self.depth -= 1

    def close(self) -> None:
        self.closed = True


class _Sender:
    def __init__(self, att: _Attachment) -> None:
        self.att = att
        self.sent: list[tuple[_Response | None, int, int]] = []  # response, flags, in_use depth
        self.done = threading.Event()

    def send(self, response: _Response | None = None, flags: int = 0) -> None:
        assert not self.done.is_set(), "a response after the final one"
        self.sent.append((response, flags, self.att.depth))
        if flags == 1:
            self.done.set()

    def answer(self) -> Answer:
        """The responses as one answer; checks the stream's shape on the way."""
        assert self.done.wait(60), "no final response"
        assert [flags for _, flags, _ in self.sent] == [0] * (len(self.sent) - 1) + [1]
        answer = Answer()
        for response, _, depth in self.sent:
            if response is None:  # a stream closed without a last response (cancelled)
                answer.finish_reason = "cancelled"
                continue
            if response.error is not None:
                assert len(self.sent) == 1, "an error after streamed text"
                answer.error = response.error.message()
                return answer
            assert depth > 0, "a response sent outside in_use()"
            outputs = response.outputs
            answer.pieces.append(outputs["text_output"].reshape(-1)[0].decode())
            answer.tokens += outputs["token_ids"].reshape(-1).tolist()
            if "finish_reason" in outputs:
                assert response is self.sent[-1][0], "finish_reason before the last response"
                answer.finish_reason = outputs["finish_reason"].reshape(-1)[0].decode()
        return answer


class _Request:
    """`cancel_after`: is_cancelled() answers True from that call on (the client hung up)."""

    def __init__(
        self,
        sender: _Sender,
        text: str | bytes,
        parameters: dict[str, Any],
        cancel_after: int | None = None,
    ) -> None:
        raw = text.encode() if isinstance(text, str) else text
        self.inputs = {"text_input": _InputTensor(np.array([raw], dtype=np.object_))}
        self._parameters = json.dumps(parameters)
        self.sender = sender
        self.cancel_after = cancel_after
        self.cancel_checks = 0

    def parameters(self) -> str:
        return self._parameters

    def is_cancelled(self) -> bool:
        self.cancel_checks += 1
        return self.cancel_after is not None and self.cancel_checks > self.cancel_after

    def get_response_sender(self) -> _Sender:
        return self.sender


#: What the model logged through the stand-in `pb_utils.Logger`.
LOGGED: list[str] = []


@pytest.fixture(scope="module")
def model_py() -> Iterator[types.ModuleType]:
    """examples/models/tinyllama/1/model.py imported outside Triton, with stand-ins for
    `triton_python_backend_utils` and the two modelswap calls (plain `from_pretrained`)."""
    utils = types.ModuleType("triton_python_backend_utils")
    utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1  # type: ignore[attr-defined]
    utils.Tensor = _Tensor  # type: ignore[attr-defined]
    utils.InferenceResponse = _Response  # type: ignore[attr-defined]
    utils.TritonError = _TritonError  # type: ignore[attr-defined]
    utils.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)  # type: ignore[attr-defined]
    utils.Logger = types.SimpleNamespace(log_info=LOGGED.append)  # type: ignore[attr-defined]
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = utils
    try:
        spec = importlib.util.spec_from_file_location(
            "tinyllama_model", MODEL_DIR / "1" / "model.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        if saved is None:
            sys.modules.pop("triton_python_backend_utils", None)
        else:
            sys.modules["triton_python_backend_utils"] = saved


class _Region:
    """A KV region's stand-in: host memory, as on the sim backend."""

    def __init__(self, size_bytes: int) -> None:
        import torch

        self.size_bytes = size_bytes
        self.tensor = torch.zeros(size_bytes, dtype=torch.uint8)

    def torch(self) -> Any:
        return self.tensor


class _KvAttachment(_Attachment):
    """An attachment with a KV region and the tiered pool over it, as the agent hands
    them: `kv_generation` is bumped by the test where a `discard` swap-out would."""

    def __init__(self, kv_bytes: int, offload_after_tokens: int, host_bytes: int) -> None:
        super().__init__()
        self.regions = {"kv": _Region(kv_bytes)}
        self.kv_generation = 0
        self.offload_after_tokens = offload_after_tokens
        self.host_bytes = host_bytes
        self.report: Any = None

    def kv_pool(self, tag: str, *, block_bytes: int, tokens_per_block: int) -> Any:
        from modelswap_client.kvpool import TieredKvPool

        region = self.regions[tag]
        return TieredKvPool(
            region.tensor.data_ptr(),
            region.size_bytes,
            block_bytes=block_bytes,
            tokens_per_block=tokens_per_block,
            offload_after_tokens=self.offload_after_tokens,
            host_bytes=self.host_bytes,
        )

    def report_kv(self, report: Any) -> None:
        self.report = report


class InProcess:
    """The example's TritonPythonModel, initialised as Triton would, over plain
    transformers; `run` sends requests through `execute` and collects the answers."""

    def __init__(
        self,
        module: types.ModuleType,
        monkeypatch: pytest.MonkeyPatch,
        att: _Attachment | None = None,
    ) -> None:
        self.att = att or _Attachment()
        monkeypatch.setattr(module, "attach_model", lambda args: self.att)

        def from_pretrained(att: Any, cls: Any, folder: Path) -> Any:
            assert att is self.att
            return cls.from_pretrained(folder).eval()

        monkeypatch.setattr(module.mstorch, "from_pretrained", from_pretrained)
        self.config = (MODEL_DIR / "config.pbtxt").read_text()
        self.model = module.TritonPythonModel()
        parameters = {
            key: {"string_value": value}
            for key, value in (
                ("model_dir", "1/hf"),
                ("default_max_tokens", "128"),
                ("cpu_threads", "1"),
            )
        }
        args = {
            "model_config": json.dumps({"parameters": parameters}),
            "model_repository": str(MODEL_DIR),
            "model_name": "tinyllama",
        }
        with torch_threads(1):  # initialize sets the process's threads: put them back after
            self.model.initialize(args)

    def run(
        self,
        requests: Sequence[tuple[str | bytes, dict[str, Any]]],
        cancel_after: int | None = None,
    ) -> list[Answer]:
        senders = [_Sender(self.att) for _ in requests]
        with torch_threads(1):
            self.model.execute(
                [
                    _Request(sender, text, parameters, cancel_after)
                    for sender, (text, parameters) in zip(senders, requests, strict=True)
                ]
            )
            answers = [s.answer() for s in senders]
        wait_for(lambda: not self.model.threads, 30, "the request threads to end")
        return answers

    def one(self, text: str | bytes, **parameters: Any) -> Answer:
        return self.run([(text, parameters)])[0]


@pytest.fixture
def served(model_py: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> InProcess:
    return InProcess(model_py, monkeypatch)


def test_greedy_tokens_and_text_equal_transformers_generate(
    served: InProcess, reference: Reference
) -> None:
    texts = [*PROMPTS, EOS_PROMPT, *(reference.chat_text(c) for c in CHATS)]
    for text in texts:
        expected = reference.tokens(text)
        for parameters in (
            {"max_tokens": MAX_TOKENS},
            {"max_tokens": MAX_TOKENS, "temperature": 0},
        ):
            answer = served.one(text, **parameters)
            assert answer.error is None, answer.error
            assert answer.tokens == expected, text
            assert answer.text == reference.text(expected), text
            assert answer.finish_reason == finish_of(expected, MAX_TOKENS)
    # The EOS prompt really ends at EOS (the weights have not changed under the test).
    assert reference.tokens(EOS_PROMPT)[-1] == EOS and len(reference.tokens(EOS_PROMPT)) == 5
    assert served.one(EOS_PROMPT, max_tokens=MAX_TOKENS).finish_reason == "stop"
    # Each request held in_use() (the sender checked every response was sent inside it).
    assert served.att.entered >= 2 * len(texts)


def test_requests_side_by_side_each_get_their_own_answer(
    served: InProcess, reference: Reference
) -> None:
    requests = [(text, {"max_tokens": MAX_TOKENS}) for text in PROMPTS]
    answers = served.run(requests)
    for (text, _), answer in zip(requests, answers, strict=True):
        assert answer.tokens == reference.tokens(text), text


def test_default_max_tokens_and_the_end_of_the_context(
    served: InProcess, reference: Reference
) -> None:
    """No max_tokens: 128 tokens, or what the 4,096-token context leaves (greedy equal to
    transformers right up to its last position); asking for more than it leaves is an
    error naming max_tokens."""
    text = "modelswap"
    expected = reference.tokens(text, 128)
    assert EOS not in expected  # so 128 is the limit that ends it
    answer = served.one(text)
    assert answer.tokens == expected and answer.finish_reason == "length"

    long_text = ("0123456789abcdef" * 256)[: CONTEXT - 6]  # BOS + 4,090 bytes: 5 tokens left
    left = CONTEXT - len(reference.ids(long_text))
    assert left == 5
    answer = served.one(long_text)
    assert answer.error is None, answer.error
    assert answer.tokens == reference.tokens(long_text, left)
    assert answer.finish_reason == finish_of(answer.tokens, left)
    refused = served.one(long_text, max_tokens=left + 1)
    assert refused.error == (
        f"max_tokens: {left + 1} is more than the {left} tokens the context leaves after the prompt"
    )
    full = served.one("x" * (CONTEXT - 1))
    assert full.error == "text_input: the prompt fills the model's whole context"


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: f"t{s[0]}-k{s[1]}-p{s[2]}")
def test_seeded_sampling_equals_transformers_sampling(
    served: InProcess, reference: Reference, sampling: tuple[float, int, float, int]
) -> None:
    temperature, top_k, top_p, seed = sampling
    parameters: dict[str, Any] = {"max_tokens": MAX_TOKENS, "temperature": temperature}
    parameters["seed"] = seed
    if top_k:
        parameters["top_k"] = top_k
    if top_p < 1.0:
        parameters["top_p"] = top_p
    text = PROMPTS[0]
    expected = reference.tokens(text, MAX_TOKENS, sampling)
    assert expected != reference.tokens(text)  # it did sample
    first, again = served.run([(text, parameters), (text, parameters)])
    assert first.tokens == again.tokens == expected
    assert first.text == reference.text(expected)


def test_unseeded_sampling_differs_between_requests(served: InProcess) -> None:
    answers = served.run([(PROMPTS[0], {"max_tokens": MAX_TOKENS, "temperature": 1.0})] * 3)
    assert len({tuple(a.tokens) for a in answers}) > 1
    assert all(len(a.tokens) == MAX_TOKENS or a.tokens[-1] == EOS for a in answers)


def test_stop_strings_cut_the_text_before_them(served: InProcess, reference: Reference) -> None:
    text = PROMPTS[1]
    expected = reference.text(reference.tokens(text))
    stop = expected[10:13]
    cut = expected.index(stop)
    for value in (stop, json.dumps(["never in it", stop])):
        answer = served.one(text, max_tokens=MAX_TOKENS, stop=value)
        assert answer.text == expected[:cut]
        assert answer.finish_reason == "stop"
        # Generation stopped at the token that completed the stop string.
        assert reference.text(answer.tokens).startswith(expected[:cut] + stop)
        assert not reference.text(answer.tokens[:-1]).startswith(expected[:cut] + stop)
    whole = served.one(text, max_tokens=MAX_TOKENS, stop="never in it")
    assert whole.text == expected and whole.finish_reason == "length"


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"temperature": -1}, "temperature: must be at least 0, not -1"),
        ({"temperature": "hot"}, "temperature: must be a number"),
        ({"top_p": 0}, "top_p: must be above 0"),
        ({"top_p": 1.5}, "top_p: must be between 0.0 and 1.0, not 1.5"),
        ({"top_k": 2.5}, "top_k: must be an integer"),
        ({"top_k": -1}, "top_k: must be at least 0, not -1"),
        ({"max_tokens": 0}, "max_tokens: must be at least 1, not 0"),
        ({"max_tokens": True}, "max_tokens: must be an integer"),
        ({"seed": 1.5}, "seed: must be an integer"),
        ({"stop": ""}, "stop: must be a non-empty string or a list of them"),
        ({"stop": '["a", 3]'}, "stop: must be a non-empty string or a list of them"),
        ({"presence_penalty": 0.5}, "presence_penalty: not implemented by this model (leave it 0)"),
        ({"frequency_penalty": 1}, "frequency_penalty: not implemented by this model (leave it 0)"),
        ({"logprobs": 21}, "logprobs: must be between 0 and 20, not 21"),
        ({"logprobs": 1.5}, "logprobs: must be an integer"),
    ],
)
def test_a_parameter_out_of_range_is_one_error_response_naming_it(
    served: InProcess, parameters: dict[str, Any], message: str
) -> None:
    answer = served.one("hello", **parameters)
    assert answer.error == message
    assert served.att.entered == 0  # refused before anything would swap the model in


def test_logprobs_and_token_counts_equal_transformers(
    served: InProcess, reference: Reference
) -> None:
    """With the `logprobs` parameter each response carries its tokens' text and
    log-probabilities (log-softmax of the logits) and the most likely alternatives; every
    response carries the prompt's token count (the gateway's OpenAI `usage`)."""
    import torch

    text, k = PROMPTS[2], 3
    sender = _Sender(served.att)
    with torch_threads(1):
        served.model.execute([_Request(sender, text, {"max_tokens": MAX_TOKENS, "logprobs": k})])
        answer = sender.answer()
    wait_for(lambda: not served.model.threads, 30, "the request thread to end")
    outputs = [response.outputs for response, _, _ in sender.sent if response is not None]
    prompt = reference.ids(text)
    assert {int(o["prompt_tokens"].reshape(-1)[0]) for o in outputs} == {len(prompt)}
    got = {
        name: [v for o in outputs for v in o[name].reshape(-1).tolist()]
        for name in ("tokens", "logprobs", "top_tokens", "top_logprobs")
    }
    expected = reference.tokens(text)
    assert answer.tokens == expected

    def shown(token: int) -> str:  # a byte as UTF-8 when whole, else OpenAI's spelling
        if token >= 256:
            return str(reference.tokenizer.convert_ids_to_tokens(token))
        return chr(token) if token < 0x80 else f"bytes:\\x{token:02x}"

    with torch_threads(1), torch.inference_mode():
        logits = reference.model(torch.tensor([prompt + expected])).logits[0].float()
    scores = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    assert [t.decode() for t in got["tokens"]] == [shown(t) for t in expected]
    want = [float(scores[i, t]) for i, t in enumerate(expected)]
    assert np.allclose(got["logprobs"], want, atol=1e-4)
    best = torch.topk(scores, k)
    assert [t.decode() for t in got["top_tokens"]] == [
        shown(t) for row in best.indices.tolist() for t in row
    ]
    assert np.allclose(got["top_logprobs"], best.values.reshape(-1).tolist(), atol=1e-4)
    # Without the parameter: no log-probabilities, the counts still.
    sender = _Sender(served.att)
    with torch_threads(1):
        served.model.execute([_Request(sender, text, {"max_tokens": 2})])
        assert sender.answer().tokens == expected[:2]
    wait_for(lambda: not served.model.threads, 30, "the request thread to end")
    for response, _, _ in sender.sent:
        assert response is not None and "logprobs" not in response.outputs
        assert int(response.outputs["prompt_tokens"].reshape(-1)[0]) == len(prompt)


def test_a_request_its_client_cancels_stops_generating(
    served: InProcess, reference: Reference
) -> None:
    """Cancelled at its fourth token: three tokens streamed, then the stream closes without
    a last response, the model says so in its log, and the request's thread ends."""
    LOGGED.clear()
    (answer,) = served.run([(PROMPTS[0], {"max_tokens": 1000})], cancel_after=3)
    assert answer.finish_reason == "cancelled"
    assert answer.tokens == reference.tokens(PROMPTS[0])[:3]
    assert LOGGED == ["tinyllama: request cancelled by its client after 3 tokens"]


def test_text_that_is_not_utf8_is_refused(served: InProcess) -> None:
    answer = served.one(b"\xff\xfe", max_tokens=2)
    assert answer.error is not None and answer.error.startswith("text_input is not UTF-8")


def test_a_stop_string_is_single_unless_it_is_a_json_list(model_py: types.ModuleType) -> None:
    assert model_py.stop_strings(None) == ()
    assert model_py.stop_strings("\n") == ("\n",)
    assert model_py.stop_strings('["a", "b"]') == ("a", "b")
    assert model_py.stop_strings("[not json") == ("[not json",)
    assert model_py.stop_strings(["x"]) == ("x",)


def test_text_stream_holds_partial_characters_and_possible_stop_strings(
    model_py: types.ModuleType, reference: Reference
) -> None:
    stream = model_py.TextStream(reference.tokenizer, ("END",))
    pieces = [stream.add(b) for b in "é".encode()]
    assert pieces == ["", "é"]  # the first byte alone is no character yet
    assert [stream.add(b) for b in b"aE"] == ["a", ""]  # "E" may start "END"
    assert stream.add(ord("x")) == "Ex"  # it did not
    assert [stream.add(b) for b in b"EN"] == ["", ""]
    assert stream.add(ord("D")) == "" and stream.stopped
    assert stream.finish() == ""

    stream = model_py.TextStream(reference.tokenizer, ("END",))
    assert [stream.add(b) for b in b"ok EN"] == ["o", "k", " ", "", ""]
    assert stream.finish() == "EN"  # held text is sent when generation ends
    stream = model_py.TextStream(reference.tokenizer, ())
    assert stream.add(0xE2) == ""
    assert stream.finish() == "\ufffd"  # as decode() renders an unfinished character


# -- conversations' KV caches (issue 29, item 4) ------------------------------------------------

#: The in-process KV tiers: 1 MiB of "HBM" (1,024 tokens of this model's K/V), 4 MiB host.
KV_BYTES = 1 << 20
KV_HOST_BYTES = 4 << 20
OFFLOAD_AFTER_TOKENS = 32


@pytest.fixture
def kv_served(model_py: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> InProcess:
    att = _KvAttachment(KV_BYTES, OFFLOAD_AFTER_TOKENS, KV_HOST_BYTES)
    return InProcess(model_py, monkeypatch, att)


def follow_up(reference: Reference, prompt: str, answer: Sequence[int], turn: str) -> str:
    """The next turn's prompt, as the chat route renders a conversation: the last prompt,
    its answer, the user's next message."""
    return f"{prompt} {reference.text(answer)}\nuser: {turn}\nassistant:"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def expected_reuse(reference: Reference, prompt: str, answer: Sequence[int], nxt: str) -> int:
    """Tokens a follow-up turn can take from the cache: the prefix it shares with the last
    prompt and answer, of what the cache holds (the answer's last token was never fed),
    leaving the new prompt's last token to compute."""
    held = [*reference.ids(prompt), *answer][:-1]
    return min(common_prefix(held, reference.ids(nxt)), len(reference.ids(nxt)) - 1)


def kv_stats(served: InProcess) -> dict[str, int]:
    report = served.att.report  # type: ignore[attr-defined]
    assert report is not None, "the model reports its KV figures with its heartbeats"
    return dict(report())


@pytest.mark.parametrize(
    ("prompt", "max_tokens"),
    [("hi", 8), (f"user: {'tell me ' * 25}\nassistant:", MAX_TOKENS)],
    ids=["shorter", "longer"],
)
def test_a_session_reuses_its_prefix_and_answers_as_transformers(
    kv_served: InProcess, reference: Reference, prompt: str, max_tokens: int
) -> None:
    """A conversation's follow-up turn computes only its new tokens and answers what plain
    transformers answers for the whole prompt, for a conversation shorter and one longer
    than offloadAfterTokens (the longer one's K/V past it in host-tier blocks)."""
    first = kv_served.one(prompt, max_tokens=max_tokens, session_id="ns/tinyllama/c1")
    assert first.error is None, first.error
    assert first.tokens == reference.tokens(prompt, max_tokens)
    stats = kv_stats(kv_served)
    assert stats["sessions"] == 1 and stats["misses"] == 1 and stats["tokens_reused"] == 0
    held = len(reference.ids(prompt)) + len(first.tokens) - 1
    assert stats["device_blocks"] == -(-min(held, OFFLOAD_AFTER_TOKENS) // 16)
    host = max(0, held - OFFLOAD_AFTER_TOKENS)
    assert stats["host_blocks"] == -(-host // 16)
    assert (stats["host_blocks"] > 0) == (max_tokens == MAX_TOKENS)  # the longer one

    nxt = follow_up(reference, prompt, first.tokens, "and then?")
    second = kv_served.one(nxt, max_tokens=MAX_TOKENS, session_id="ns/tinyllama/c1")
    assert second.tokens == reference.tokens(nxt)
    stats = kv_stats(kv_served)
    reused = expected_reuse(reference, prompt, first.tokens, nxt)
    assert reused > len(reference.ids(prompt)) - 1  # the prompt and some of the answer
    assert stats["tokens_reused"] == reused
    assert stats["hits"] == 1 and stats["tokens_recomputed"] == 0


def test_a_discarded_cache_is_computed_again_and_answers_stay_right(
    kv_served: InProcess, reference: Reference
) -> None:
    """The KV bytes lost (the attachment's kv_generation moved, as a `discard` swap-out
    moves it): the next turn computes the cached tokens again from the session's token
    ids, counts them, and answers as transformers does."""
    prompt = reference.chat_text(CHATS[1])
    first = kv_served.one(prompt, max_tokens=MAX_TOKENS, session_id="s")
    held = len(reference.ids(prompt)) + len(first.tokens) - 1
    kv_served.att.kv_generation += 1  # type: ignore[attr-defined]
    nxt = follow_up(reference, prompt, first.tokens, "more")
    second = kv_served.one(nxt, max_tokens=MAX_TOKENS, session_id="s")
    assert second.tokens == reference.tokens(nxt)
    stats = kv_stats(kv_served)
    recomputed = expected_reuse(reference, prompt, first.tokens, nxt)
    assert 0 < recomputed <= held
    assert stats["tokens_recomputed"] == recomputed and stats["tokens_reused"] == 0
    assert stats["misses"] == 2 and stats["hits"] == 0


def test_sessions_side_by_side_and_requests_without_one(
    kv_served: InProcess, reference: Reference
) -> None:
    """Concurrent sessions each get their own answer (their turns take the store one at a
    time), a request naming no session uses no pool block, and the sessions beyond
    max_sessions (16) are evicted least recently used first."""
    prompts = [reference.chat_text(c) for c in CHATS] + list(PROMPTS[:2])
    requests = [
        (p, {"max_tokens": MAX_TOKENS, "session_id": f"s{i}"}) for i, p in enumerate(prompts)
    ]
    requests.append((PROMPTS[2], {"max_tokens": MAX_TOKENS}))
    answers = kv_served.run(requests)
    assert [a.tokens for a in answers] == [reference.tokens(t) for t, _ in requests]
    stats = kv_stats(kv_served)
    assert stats["sessions"] == len(prompts) and stats["misses"] == len(prompts)
    # the second turns, side by side, each reuse their own conversation
    answers = answers[: len(prompts)]
    nexts = [follow_up(reference, p, a.tokens, "ok") for p, a in zip(prompts, answers, strict=True)]
    again = kv_served.run(
        [(n, {"max_tokens": MAX_TOKENS, "session_id": f"s{i}"}) for i, n in enumerate(nexts)]
    )
    assert [a.tokens for a in again] == [reference.tokens(n) for n in nexts]
    stats = kv_stats(kv_served)
    assert stats["hits"] == len(prompts)
    assert stats["tokens_reused"] == sum(
        expected_reuse(reference, p, a.tokens, n)
        for p, a, n in zip(prompts, answers, nexts, strict=True)
    )
    # past max_sessions: the oldest go
    many = kv_served.run([("x", {"max_tokens": 2, "session_id": f"more{i}"}) for i in range(16)])
    assert all(a.error is None for a in many)
    stats = kv_stats(kv_served)
    assert stats["sessions"] == 16 and stats["evictions"] == len(prompts)


def test_a_session_near_the_4096_token_context_reuses_its_prefix(
    kv_served: InProcess, reference: Reference
) -> None:
    """A conversation of nearly the whole context (4,096 tokens): its K/V past
    offloadAfterTokens in the host tier, the follow-up answered as transformers answers
    the whole prompt, its prefix reused."""
    prompt = ("0123456789abcdef" * 256)[: CONTEXT - 200]
    first = kv_served.one(prompt, max_tokens=8, session_id="long")
    assert first.tokens == reference.tokens(prompt, 8)
    nxt = follow_up(reference, prompt, first.tokens, "ok")
    assert len(reference.ids(nxt)) + MAX_TOKENS < CONTEXT
    second = kv_served.one(nxt, max_tokens=MAX_TOKENS, session_id="long")
    assert second.tokens == reference.tokens(nxt)
    stats = kv_stats(kv_served)
    assert stats["tokens_reused"] == expected_reuse(reference, prompt, first.tokens, nxt) > 3800
    assert stats["host_bytes"] > 3 << 20  # past the first 32 tokens: host tier


def test_sessions_beyond_the_tiers_are_evicted_and_answer_right(
    model_py: types.ModuleType, monkeypatch: pytest.MonkeyPatch, reference: Reference
) -> None:
    """Tiers too small for every conversation (4 KV-region blocks, 16 host blocks of 16
    tokens): sessions are evicted least recently used, an evicted one starts again, every
    answer equals transformers', and the host tier never holds more than its bytes."""
    host_bytes = 16 * 16 << 10
    att = _KvAttachment(4 * 16 << 10, OFFLOAD_AFTER_TOKENS, host_bytes)
    served = InProcess(model_py, monkeypatch, att)
    prompts = [f"user: {word * 12}\nassistant:" for word in ("alpha ", "beta ", "gamma ")]
    answers = {}
    for turn in range(2):
        for i, prompt in enumerate(prompts):
            text = prompt if turn == 0 else follow_up(reference, prompt, answers[i], "more")
            answer = served.one(text, max_tokens=MAX_TOKENS, session_id=f"s{i}")
            assert answer.error is None, answer.error
            assert answer.tokens == reference.tokens(text), (turn, i)
            answers.setdefault(i, answer.tokens)
            stats = kv_stats(served)
            assert stats["host_bytes"] <= host_bytes
    assert stats["evictions"] > 0


# -- the Hugging Face folder ---------------------------------------------------------------------


def test_the_committed_files_are_what_make_weights_writes() -> None:
    files = make_weights.tinyllama_files()
    assert sorted(files) == sorted(p.name for p in HF_DIR.iterdir())
    for name, data in files.items():
        assert (HF_DIR / name).read_bytes() == data, f"{name} differs: run make_weights.py"
    # and the numpy toys' files, which the same script writes, are unchanged by it
    assert (MODELS / "mlp" / "1" / "weights.f32").read_bytes() == make_weights.mlp_weights()
    assert (MODELS / "tinylm" / "1" / "weights.i32").read_bytes() == make_weights.tinylm_weights()


def test_the_folder_is_a_llama_that_transformers_loads_whole(reference: Reference) -> None:
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    loaded: Any = AutoModelForCausalLM.from_pretrained(HF_DIR, output_loading_info=True)
    model, info = loaded
    assert isinstance(model, LlamaForCausalLM)
    assert info == {
        "missing_keys": set(),
        "unexpected_keys": set(),
        "mismatched_keys": set(),
        "error_msgs": [],
    }
    assert model.config.max_position_embeddings >= 4096
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tokenizer = reference.tokenizer
    assert reference.ids("hé") == [make_weights.BOS_ID, ord("h"), 0xC3, 0xA9]
    assert tokenizer.eos_token_id == EOS and len(tokenizer) == 258
    assert reference.text([*"hé".encode(), EOS]) == "hé"


def test_the_chat_template_renders_what_the_gateway_sends(reference: Reference) -> None:
    for chat in CHATS:
        rendered: Any = reference.tokenizer.apply_chat_template(
            list(chat), add_generation_prompt=True
        )
        assert list(rendered["input_ids"]) == reference.ids(reference.chat_text(chat))


def test_the_example_s_weights_bytes_is_what_the_model_needs() -> None:
    """examples/tinyllama.yaml's weightsBytes is `required_bytes` of the model, rounded up
    to MiB (what `modelswap size` prints)."""
    from transformers import AutoModelForCausalLM

    from modelswap_client import torch as mstorch

    with mstorch.empty_parameters():
        model = mstorch.build_pretrained(AutoModelForCausalLM, HF_DIR)
    required = mstorch.required_bytes(model)
    mib = -(-required // (1 << 20))
    assert example_weights_bytes() == f"{mib}Mi"


def example_weights_bytes() -> str:
    doc = yaml.safe_load(EXAMPLE_YAML.read_text())
    return str(doc["spec"]["model"]["weightsBytes"])


# -- served by local mode: real Triton, the agent on a sim GPU, the gateway ---------------------


def tinyllama_yaml(idle_after: str = "never") -> str:
    return f"""\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: tinyllama
spec:
  model:
    source: {{uri: /models/tinyllama}}
    weightsBytes: {example_weights_bytes()}
  swapPolicy:
    idleAfter: {idle_after}
    minResident: 1s
    onSwapOut: host
"""


def sse_events(body: str) -> list[str]:
    """The `data:` payloads of an event stream, in order."""
    return [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]


def v2_generate(
    node: LocalNode, text: str, parameters: dict[str, Any], model: str = "tinyllama"
) -> Answer:
    r = node.post(
        f"/v2/models/{model}/generate_stream", {"text_input": text, "parameters": parameters}
    )
    assert r.status_code == 200, r.text
    answer = Answer()
    for data in sse_events(r.text):
        event = json.loads(data)
        assert "error" not in event, event
        answer.pieces.append(event["text_output"])
        ids = event["token_ids"]  # Triton writes a one-element tensor as a number
        answer.tokens += ids if isinstance(ids, list) else [ids]
        answer.finish_reason = event.get("finish_reason", answer.finish_reason)
    return answer


def openai_text(node: LocalNode, route: str, body: dict[str, Any]) -> tuple[str, str]:
    """(text, finish_reason) of a completion or chat completion, streamed or not."""
    r = node.post(route, {"model": "tinyllama", **body})
    assert r.status_code == 200, r.text
    chat = route.endswith("chat/completions")
    if not body.get("stream"):
        choice = r.json()["choices"][0]
        return (choice["message"]["content"] if chat else choice["text"]), choice["finish_reason"]
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    pieces = [(c["delta"].get("content", "") if chat else c["text"]) for c in chunks]
    assert all(c["finish_reason"] is None for c in chunks[:-1])
    return "".join(pieces), chunks[-1]["finish_reason"]


def check_answers(node: LocalNode, reference: Reference, *, first: str = "v2") -> None:
    """Greedy answers through every route equal the reference. `first` picks the route of
    the first request (the one a swapped-out model is swapped in for)."""
    limit = {"max_tokens": MAX_TOKENS}
    routes = ["v2", "completions", "chat"]
    routes.sort(key=lambda r: r != first)
    for route in routes:
        if route == "v2":
            for text in (*PROMPTS, EOS_PROMPT):
                expected = reference.tokens(text)
                answer = v2_generate(node, text, limit)
                assert answer.tokens == expected, text
                assert answer.text == reference.text(expected), text
                assert answer.finish_reason == finish_of(expected, MAX_TOKENS)
        elif route == "completions":
            for text in (*PROMPTS[:2], EOS_PROMPT):
                expected = reference.tokens(text)
                for stream in (True, False):
                    got = openai_text(
                        node, "/v1/completions", {"prompt": text, "stream": stream, **limit}
                    )
                    assert got == (reference.text(expected), finish_of(expected, MAX_TOKENS))
        else:
            for chat in CHATS:
                expected = reference.tokens(reference.chat_text(chat))
                for stream in (True, False):
                    got = openai_text(
                        node,
                        "/v1/chat/completions",
                        {"messages": list(chat), "stream": stream, **limit},
                    )
                    assert got == (reference.text(expected), finish_of(expected, MAX_TOKENS))


def hang_up_mid_stream(node: LocalNode) -> None:
    """A client that hangs up after the first chunk of a 4,000-token stream: the gateway
    cancels the request and the model stops generating (it logs so) long before the end."""
    body = {"model": "tinyllama", "prompt": "hi", "max_tokens": 4000, "stream": True}
    with (
        httpx.Client(timeout=60, trust_env=False) as client,
        client.stream("POST", f"{node.gateway}/v1/completions", json=body) as r,
    ):
        assert r.status_code == 200
        assert next(line for line in r.iter_lines() if line.startswith("data: "))
    cancelled = wait_for(
        lambda: re.search(r"request cancelled by its client after (\d+) tokens", node.log()),
        30,
        "the model to stop generating for the client that hung up",
    )
    assert int(cancelled.group(1)) < 4000


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_served_answers_equal_transformers_before_and_after_swaps(reference: Reference) -> None:
    with local_up({"tinyllama.yaml": tinyllama_yaml()}, MODELS) as node:
        node.wait_phase("tinyllama", "Resident", LOAD_SECONDS)
        check_answers(node, reference)

        # Side by side, seeded sampling, a stop string, and a refused parameter.
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = list(
                pool.map(lambda text: v2_generate(node, text, {"max_tokens": MAX_TOKENS}), PROMPTS)
            )
        assert [a.tokens for a in answers] == [reference.tokens(t) for t in PROMPTS]
        temperature, top_k, top_p, seed = sampling = SAMPLINGS[3]
        sampled = v2_generate(
            node,
            PROMPTS[0],
            {"max_tokens": MAX_TOKENS, "temperature": temperature, "top_k": top_k,
             "top_p": top_p, "seed": seed},
        )  # fmt: skip
        assert sampled.tokens == reference.tokens(PROMPTS[0], MAX_TOKENS, sampling)
        expected = reference.text(reference.tokens(PROMPTS[1]))
        stop = expected[10:13]
        got = openai_text(
            node,
            "/v1/completions",
            {"prompt": PROMPTS[1], "max_tokens": MAX_TOKENS, "stop": ["never", stop]},
        )
        assert got == (expected[: expected.index(stop)], "stop")
        r = node.post("/v1/completions", {"model": "tinyllama", "prompt": "x", "temperature": -1})
        assert r.status_code == 400 and "temperature: must be at least 0" in r.text, r.text
        hang_up_mid_stream(node)

        # A manual swap-out; the next request (a v2 stream) swaps it back in.
        before = node.model("tinyllama")
        answer = node.swap("tinyllama", "out")
        assert answer["outcome"] == "completed", answer
        assert node.model("tinyllama")["phase"] == "SwappedOut"
        check_answers(node, reference, first="v2")
        after = node.model("tinyllama")
        assert after["phase"] == "Resident"
        assert after["swapIns"] == before["swapIns"] + 1
        assert after["swapOuts"] == before["swapOuts"] + 1

        # An idle swap-out (a live edit to idleAfter 1s); a chat request swaps it back in.
        (node.folder / "tinyllama.yaml").write_text(tinyllama_yaml("1s"))
        before = node.wait_phase("tinyllama", "SwappedOut", 60)
        check_answers(node, reference, first="chat")
        assert node.model("tinyllama")["swapIns"] > before["swapIns"]
        assert "loading afresh" not in node.log()


# -- served conversations: the KV cache through the gateway, across swaps -----------------------

SESSION_HEADER = "X-Modelswap-Session"
#: Served KV tiers: 2 MiB of KV region (2,048 tokens of this model's K/V, 1 KiB a token),
#: sequences past 64 tokens in the host tier (8 MiB).
SERVED_OFFLOAD_AFTER_TOKENS = 64


def kv_yaml(name: str, kv: str) -> str:
    return f"""\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: {name}
spec:
  model:
    source: {{uri: /models/tinyllama}}
    weightsBytes: {example_weights_bytes()}
    kvCacheBytes: 2Mi
  swapPolicy:
    idleAfter: never
    minResident: 1s
    onSwapOut: host
    kv: {kv}
  kvCache:
    offloadAfterTokens: {SERVED_OFFLOAD_AFTER_TOKENS}
    hostBytes: 8Mi
"""


def kv_figures(node: LocalNode, model: str) -> dict[str, float]:
    """The agent's `modelswap_kv_*` samples for `model` (blocks by tier as
    `blocks_device`/`blocks_host`), from its /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(str(node.state["metricsUrl"]), timeout=10, trust_env=False).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("modelswap_kv_"):
                continue
            if sample.labels.get("model") != model:
                continue
            key = sample.name.removeprefix("modelswap_kv_")
            if "tier" in sample.labels:
                key = f"{key}_{sample.labels['tier']}"
            found[key] = sample.value
    return found


def kv_bytes(node: LocalNode, model: str) -> tuple[int, int]:
    """(GPU, host) KV bytes the agent reports for `model` (control API, `ModelInfo`)."""
    info = node.model(model)
    return int(info.get("kvGpuBytes", 0)), int(info.get("kvHostBytes", 0))


def status_wide(node: LocalNode) -> dict[str, dict[str, str]]:
    """`modelswap status -o wide` as {name: {COLUMN: cell}}."""
    out = subprocess.run(
        [sys.executable, "-m", "modelswap_api.cli", "status", "--run-dir", str(node.run_dir),
         "-o", "wide"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    header, *lines = out.splitlines()
    names = header.split()
    return {
        cells[0]: dict(zip(names, cells, strict=True))
        for cells in (line.split() for line in lines)
        if len(cells) == len(names)
    }


@dataclass
class Conversation:
    """One session's turns through one route: `chat` (OpenAI chat, `stream` or not) or
    `v2` (generate_stream with `parameters.session_id`)."""

    model: str
    session: str
    route: str
    stream: bool
    messages: list[dict[str, str]]
    last: str = ""  # the last answer's text

    def prompt(self) -> str:
        return chat_prompt(self.messages)

    def turn(self, node: LocalNode, reference: Reference) -> None:
        """Send the conversation so far; its answer must be transformers' for the whole
        prompt (computed with no cache tricks); the answer joins the conversation."""
        expected = reference.tokens(self.prompt())
        want = (reference.text(expected), finish_of(expected, MAX_TOKENS))
        if self.route == "v2":
            r = httpx.post(
                f"{node.gateway}/v2/models/{self.model}/generate_stream",
                json={"text_input": self.prompt(),
                      "parameters": {"max_tokens": MAX_TOKENS, "session_id": self.session}},
                timeout=120, trust_env=False,
            )  # fmt: skip
            assert r.status_code == 200, r.text
            answer = Answer()
            for data in sse_events(r.text):
                event = json.loads(data)
                assert "error" not in event, event
                answer.pieces.append(event["text_output"])
                ids = event["token_ids"]
                answer.tokens += ids if isinstance(ids, list) else [ids]
                answer.finish_reason = event.get("finish_reason", answer.finish_reason)
            assert answer.tokens == expected, self.session
            got = (answer.text, answer.finish_reason)
        else:
            r = httpx.post(
                f"{node.gateway}/v1/chat/completions",
                json={"model": self.model, "messages": self.messages, "stream": self.stream,
                      "max_tokens": MAX_TOKENS},
                headers={SESSION_HEADER: self.session}, timeout=120, trust_env=False,
            )  # fmt: skip
            assert r.status_code == 200, r.text
            if self.stream:
                events = sse_events(r.text)
                assert events[-1] == "[DONE]"
                chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
                got = ("".join(c["delta"].get("content", "") for c in chunks),
                       chunks[-1]["finish_reason"])  # fmt: skip
            else:
                choice = r.json()["choices"][0]
                got = (choice["message"]["content"], choice["finish_reason"])
        assert got == want, self.session
        self.last = got[0]

    def follow_up(self, text: str) -> None:
        self.messages += [{"role": "assistant", "content": self.last},
                          {"role": "user", "content": text}]  # fmt: skip


def conversations(model: str) -> list[Conversation]:
    """Side by side: a short one streamed, a long one (past offloadAfterTokens) not
    streamed, and a long one over the generate extension."""
    long_text = "please swap the idle models out and page them back in " * 3
    return [
        Conversation(model, "short", "chat", True, [{"role": "user", "content": "hi"}]),
        Conversation(model, "long", "chat", False, [{"role": "user", "content": long_text}]),
        Conversation(model, "v2", "v2", True, [{"role": "user", "content": long_text[::-1]}]),
    ]


def side_by_side(node: LocalNode, reference: Reference, talks: Sequence[Conversation]) -> None:
    with concurrent.futures.ThreadPoolExecutor(len(talks)) as pool:
        for done in [pool.submit(t.turn, node, reference) for t in talks]:
            done.result()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_served_conversations_keep_their_kv_across_swaps(reference: Reference) -> None:
    """Through the gateway, concurrent sessions (chat streamed and not, generate_stream)
    answer plain transformers' tokens on every turn; the KV of the long ones goes to the
    host tier past offloadAfterTokens. Swapped out mid-conversation: with `kv: preserve`
    the next turns answer the same and compute no cached token again (the agent's
    modelswap_kv_tokens_recomputed_total stays 0 while tokens reused grow); with
    `discard`, the same answers and the recompute counted; and after `preserve` is edited
    to `discard` mid-conversation, the same again."""
    files = {"keep.yaml": kv_yaml("keep", "preserve"), "drop.yaml": kv_yaml("drop", "discard")}
    with local_up(files, MODELS) as node:
        for name in ("keep", "drop"):
            node.wait_phase(name, "Resident", LOAD_SECONDS)
        talks = {name: conversations(name) for name in ("keep", "drop")}
        for name, chats in talks.items():
            assert kv_bytes(node, name) == (0, 0)  # no conversation yet
            # the short one alone: its K/V in the KV region only (GPU)
            chats[0].turn(node, reference)
            short = wait_for(lambda n=name: (b := kv_bytes(node, n))[0] > 0 and b, 30,
                             f"{name}'s KV bytes in the KV region")  # fmt: skip
            assert short[1] == 0
            # the long ones side by side: past offloadAfterTokens, K/V in the host tier
            side_by_side(node, reference, chats[1:])
            # a request naming no session still answers right, beside them
            check_plain = v2_generate(node, PROMPTS[0], {"max_tokens": MAX_TOKENS}, name)
            assert check_plain.tokens == reference.tokens(PROMPTS[0])
            crossed = wait_for(lambda n=name: (b := kv_bytes(node, n))[1] > 0 and b, 30,
                               f"{name}'s KV bytes in the host tier")  # fmt: skip
            assert crossed[0] >= short[0]
        wide = status_wide(node)
        for name in talks:
            gpu, host = kv_bytes(node, name)
            assert wide[name]["KV"] == f"{format_bytes(gpu)}/{format_bytes(host)}", wide
            first = wait_for(
                lambda name=name: (f := kv_figures(node, name)).get("blocks_host", 0) > 0 and f,
                30,
                f"{name}'s KV report (host-tier blocks of the long sessions)",
            )
            assert first["session_misses_total"] == 3 and first["tokens_recomputed_total"] == 0
            assert first["blocks_device"] > 0

        for name, chats in talks.items():
            before = kv_figures(node, name)
            answer = node.swap(name, "out")
            assert answer["outcome"] == "completed", answer
            assert node.model(name)["phase"] == "SwappedOut"
            # swapped out, the KV region holds no GPU memory; the host tier is kept
            assert kv_bytes(node, name)[0] == 0
            for talk in chats:
                talk.follow_up("go on")
            side_by_side(node, reference, chats)  # the first one swaps it back in
            assert node.model(name)["phase"] == "Resident"
            held = sum(len(reference.ids(t.messages[0]["content"])) for t in chats)

            def reported(name: str = name, before: dict[str, float] = before) -> Any:
                now = kv_figures(node, name)
                turns = now["session_hits_total"] + now["session_misses_total"]
                earlier = before["session_hits_total"] + before["session_misses_total"]
                return now if turns == earlier + 3 else None

            after = wait_for(reported, 30, f"{name}'s KV report of the second turns")
            if name == "keep":
                assert after["tokens_recomputed_total"] == 0
                assert after["session_hits_total"] == 3
                assert after["tokens_reused_total"] >= held
            else:
                assert after["tokens_recomputed_total"] >= held
                assert after["tokens_reused_total"] == 0
                assert after["session_misses_total"] == 6

        # The policy flipped mid-conversation (a live edit of keep.yaml to kv: discard):
        # the next swap-out discards, and the third turns still answer transformers'
        # tokens, their cached prefixes computed again and counted.
        chats, generation = talks["keep"], node.model("keep")["generation"]
        before = kv_figures(node, "keep")
        (node.folder / "keep.yaml").write_text(kv_yaml("keep", "discard"))
        wait_for(lambda: node.model("keep")["generation"] > generation, 60, "the edit applied")
        assert node.swap("keep", "out")["outcome"] == "completed"
        for talk in chats:
            talk.follow_up("and now?")
        side_by_side(node, reference, chats)
        flipped = wait_for(
            lambda: (f := kv_figures(node, "keep"))["session_misses_total"] == 3 + 3 and f,
            30,
            "keep's KV report of the third turns",
        )
        assert flipped["tokens_recomputed_total"] > before["tokens_recomputed_total"] == 0
        assert flipped["session_hits_total"] == before["session_hits_total"]


def test_answers_are_checked_against_transformers_not_a_fixed_string(reference: Reference) -> None:
    """The reference differs between prompts and is not an echo of the prompt (a broken
    model that repeated its input, or ignored it, would fail the served test)."""
    answers = {tuple(reference.tokens(t)) for t in PROMPTS}
    assert len(answers) == len(PROMPTS)
    for text in PROMPTS:
        assert reference.text(reference.tokens(text)) not in text
