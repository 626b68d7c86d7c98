"""OpenAI completeness against the real Triton and gateway (local mode) with the tinyllama
example: `stop`, `echo`, `logprobs`/`top_logprobs`, `finish_reason` and `usage`, for
completions and chat, streamed and not, each compared with a reference computed here by
plain transformers on the same weights (greedy `generate` with its logits).

Each parameter is checked on the wire (httpx, so every field of the answer is seen), then
once more through the official `openai` SDK, as users call it (`sdk_reads_the_same`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelswap_sidecar.gateway.openai import chat_prompt
from tests.support.local_up import LocalNode, local_up

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"
HF_DIR = MODELS / "tinyllama" / "1" / "hf"
EXAMPLE_YAML = ROOT / "examples" / "tinyllama.yaml"
#: The torch import and the model load in the stub take 15-30 s on a busy 2-core machine.
LOAD_SECONDS = 240
MAX_TOKENS = 24
#: The model's own default when a request gives no max_tokens (its config.pbtxt).
DEFAULT_MAX_TOKENS = 128
PROMPT = "The quick brown fox"
#: Greedy ends at EOS after 5 tokens.
EOS_PROMPT = "stop there"
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "swap me in"}]
TOP = 3
LOGPROB_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Generated:
    prompt_tokens: int
    tokens: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]


class Reference:
    """The example's folder loaded by plain transformers: greedy tokens, their log-softmax
    and the most likely alternatives at each step."""

    def __init__(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(HF_DIR)
        model: Any = AutoModelForCausalLM.from_pretrained(HF_DIR)
        self.model: Any = model.eval()

    def run(self, text: str, max_tokens: int = MAX_TOKENS) -> Generated:
        import torch

        ids = torch.tensor([self.tokenizer(text)["input_ids"]])
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
        tokens = out.sequences[0, ids.shape[1] :].tolist()
        logprobs, top = [], []
        for token, logits in zip(tokens, out.logits, strict=True):
            scores = torch.log_softmax(logits[0].float(), dim=-1)
            logprobs.append(float(scores[token]))
            best = torch.topk(scores, TOP)
            top.append(list(zip(best.indices.tolist(), best.values.tolist(), strict=True)))
        return Generated(ids.shape[1], tokens, logprobs, top)

    def text(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def token_text(self, token: int) -> str:
        """As the example names a token: a byte as UTF-8 when it is one character, else
        OpenAI's `bytes:\\xNN`; a special token by its name."""
        if token >= 256:
            return str(self.tokenizer.convert_ids_to_tokens(token))
        return chr(token) if token < 0x80 else f"bytes:\\x{token:02x}"

    def until_stop(self, generated: Generated, stop: str) -> tuple[str, int]:
        """(the text before `stop`, how many tokens it took to see `stop`)."""
        for n in range(1, len(generated.tokens) + 1):
            text = self.text(generated.tokens[:n])
            if stop in text:
                return text[: text.index(stop)], n
        raise AssertionError(f"{stop!r} is not in the reference's text")


def stop_in(text: str) -> str:
    """A stop sequence for `text`: printable ASCII past its start, as long as one is (up to
    3), whose first occurrence is there."""
    for length in (3, 2, 1):
        for i in range(3, len(text) - length):
            s = text[i : i + length]
            if s.isascii() and s.isprintable() and s not in text[: i + length - 1]:
                return s
    raise AssertionError(f"no stop sequence for {text!r}")


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, abs_tol=LOGPROB_TOLERANCE)


def tinyllama_yaml() -> str:
    weights = yaml.safe_load(EXAMPLE_YAML.read_text())["spec"]["model"]["weightsBytes"]
    return f"""\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: tinyllama
spec:
  model:
    source: {{uri: /models/tinyllama}}
    weightsBytes: {weights}
  swapPolicy:
    idleAfter: never
    minResident: 1s
    onSwapOut: host
"""


@dataclass
class Got:
    """One answer as a client reads it, streamed or not."""

    text: str
    finish_reason: str
    usage: dict[str, int] | None
    logprobs: list[dict[str, Any]]  # completions: one dict per chunk; chat: content items
    chunks: int = 1


def ask(node: LocalNode, route: str, body: dict[str, Any]) -> Got:
    r = node.post(route, {"model": "tinyllama", **body})
    assert r.status_code == 200, r.text
    chat = route.endswith("chat/completions")
    if not body.get("stream"):
        answer = r.json()
        choice = answer["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        logprobs = choice["logprobs"]
        items = [] if logprobs is None else (logprobs["content"] if chat else [logprobs])
        return Got(text, choice["finish_reason"], answer["usage"], items)
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage = None
    if body.get("stream_options", {}).get("include_usage"):
        *chunks, last = chunks
        assert last["choices"] == [] and all(c["usage"] is None for c in chunks)
        usage = last["usage"]
    choices = [c["choices"][0] for c in chunks]
    assert all(c["finish_reason"] is None for c in choices[:-1])
    text = "".join((c["delta"].get("content") or "") if chat else c["text"] for c in choices)
    items: list[dict[str, Any]] = []
    for c in choices:
        if c["logprobs"] is not None:
            items += c["logprobs"]["content"] if chat else [c["logprobs"]]
    return Got(text, choices[-1]["finish_reason"], usage, items, len(choices))


def completion_logprobs(items: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Completions' logprobs joined across chunks."""
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    return {key: [v for item in items for v in (item[key] or [])] for key in keys}


def check_completion_logprobs(got: Got, reference: Reference, generated: Generated, n: int) -> None:
    joined = completion_logprobs(got.logprobs)
    tokens = generated.tokens[:n]
    assert joined["tokens"] == [reference.token_text(t) for t in tokens]
    assert all(
        close(a, b) for a, b in zip(joined["token_logprobs"], generated.logprobs, strict=False)
    )
    assert len(joined["token_logprobs"]) == n
    offsets = joined["text_offset"]
    assert offsets == sorted(offsets) and offsets[0] == 0
    if all(item["top_logprobs"] is None for item in got.logprobs):
        return  # none asked for (logprobs: 0)
    for got_top, want_top in zip(joined["top_logprobs"], generated.top[:n], strict=True):
        assert list(got_top) == [reference.token_text(i) for i, _ in want_top]
        assert all(close(got_top[reference.token_text(i)], lp) for i, lp in want_top)


def check_chat_logprobs(got: Got, reference: Reference, generated: Generated) -> None:
    assert [c["token"] for c in got.logprobs] == [reference.token_text(t) for t in generated.tokens]
    for item, token, logprob, top in zip(
        got.logprobs, generated.tokens, generated.logprobs, generated.top, strict=True
    ):
        assert close(item["logprob"], logprob)
        assert item["bytes"] == (
            [token] if token < 256 else list(reference.token_text(token).encode())
        )
        assert [t["token"] for t in item["top_logprobs"]] == [
            reference.token_text(i) for i, _ in top
        ]
        assert all(
            close(t["logprob"], lp) for t, (_, lp) in zip(item["top_logprobs"], top, strict=True)
        )


def usage_of(generated: Generated, completion_tokens: int | None = None) -> dict[str, int]:
    n = len(generated.tokens) if completion_tokens is None else completion_tokens
    return {
        "prompt_tokens": generated.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": generated.prompt_tokens + n,
    }


def refused(node: LocalNode, route: str, body: dict[str, Any], field: str) -> None:
    r = node.post(route, {"model": "tinyllama", **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"].startswith(f"{field}:") and error["param"] == field, error


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_openai_parameters_match_the_transformers_reference() -> None:
    reference = Reference()
    greedy = reference.run(PROMPT)
    expected = reference.text(greedy.tokens)
    assert len(greedy.tokens) == MAX_TOKENS and greedy.tokens[-1] != 257
    at_eos = reference.run(EOS_PROMPT)
    assert at_eos.tokens[-1] == 257 and len(at_eos.tokens) < MAX_TOKENS
    chat = reference.run(chat_prompt(CHAT))
    # A stop sequence in the middle of the text: three ASCII characters of it.
    stop = stop_in(expected)
    before_stop, stop_tokens = reference.until_stop(greedy, stop)
    default = reference.run(PROMPT, DEFAULT_MAX_TOKENS)
    limit = {"max_tokens": MAX_TOKENS}

    with local_up({"tinyllama.yaml": tinyllama_yaml()}, MODELS) as node:
        node.wait_phase("tinyllama", "Resident", LOAD_SECONDS)
        for stream in (False, True):
            streamed: dict[str, Any] = {"stream": stream}
            if stream:
                streamed["stream_options"] = {"include_usage": True}
            # Completions: text, finish_reason length, usage, logprobs with alternatives.
            got = ask(node, "/v1/completions", {"prompt": PROMPT, **limit, **streamed,
                                                "logprobs": TOP})  # fmt: skip
            assert (got.text, got.finish_reason) == (expected, "length")
            assert got.usage == usage_of(greedy)
            check_completion_logprobs(got, reference, greedy, MAX_TOKENS)
            # EOS: finish_reason stop, EOS counted as a completion token.
            got = ask(node, "/v1/completions", {"prompt": EOS_PROMPT, **limit, **streamed})
            assert (got.text, got.finish_reason) == (reference.text(at_eos.tokens), "stop")
            assert got.usage == usage_of(at_eos)
            assert got.logprobs == []
            # A stop sequence (one of a list): the text before it, and generation stopped
            # at the token that completed it (usage counts what was generated).
            got = ask(node, "/v1/completions",
                      {"prompt": PROMPT, **limit, **streamed, "stop": ["never in it", stop],
                       "logprobs": 0})  # fmt: skip
            assert (got.text, got.finish_reason) == (before_stop, "stop")
            assert got.usage == usage_of(greedy, stop_tokens)
            check_completion_logprobs(got, reference, greedy, stop_tokens)
            assert all(item["top_logprobs"] is None for item in got.logprobs)
            # echo: the prompt first.
            got = ask(node, "/v1/completions", {"prompt": PROMPT, **limit, **streamed,
                                                "echo": True})  # fmt: skip
            assert (got.text, got.finish_reason) == (PROMPT + expected, "length")
            # No max_tokens: the model's own default ends it, which is `length` too.
            got = ask(node, "/v1/completions", {"prompt": PROMPT, **streamed})
            assert got.text == reference.text(default.tokens)
            assert got.finish_reason == "length" and got.usage == usage_of(default)
            # Chat: the content, logprobs with top_logprobs, usage.
            got = ask(node, "/v1/chat/completions",
                      {"messages": CHAT, **limit, **streamed, "logprobs": True,
                       "top_logprobs": TOP})  # fmt: skip
            reason = "stop" if chat.tokens[-1] == 257 else "length"
            assert (got.text, got.finish_reason) == (reference.text(chat.tokens), reason)
            assert got.usage == usage_of(chat)
            check_chat_logprobs(got, reference, chat)
            # Chat with a stop sequence of the chat's own text.
            chat_text = reference.text(chat.tokens)
            chat_stop = stop_in(chat_text)
            chat_before, chat_n = reference.until_stop(chat, chat_stop)
            got = ask(node, "/v1/chat/completions",
                      {"messages": CHAT, **limit, **streamed, "stop": chat_stop})  # fmt: skip
            assert (got.text, got.finish_reason) == (chat_before, "stop")
            assert got.usage == usage_of(chat, chat_n)

        sdk_reads_the_same(node, reference, greedy, expected, stop, before_stop, chat)

        # What the model cannot do is refused, naming the field, never ignored.
        refused(node, "/v1/completions", {"prompt": "x", "logprobs": 3, "echo": True}, "echo")
        refused(node, "/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs")
        refused(node, "/v1/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]},
                "stop")  # fmt: skip
        refused(node, "/v1/completions", {"prompt": "x", "suffix": "y"}, "suffix")
        refused(node, "/v1/completions", {"prompt": "x", "presence_penalty": 1.0},
                "presence_penalty")  # fmt: skip
        refused(node, "/v1/chat/completions",
                {"messages": CHAT, "top_logprobs": 2}, "top_logprobs")  # fmt: skip
        refused(node, "/v1/chat/completions",
                {"messages": CHAT, "response_format": {"type": "json_object"}},
                "response_format")  # fmt: skip


def sdk_reads_the_same(  # noqa: PLR0917 (the reference's answers, in one call)
    node: LocalNode,
    reference: Reference,
    greedy: Generated,
    expected: str,
    stop: str,
    before_stop: str,
    chat: Generated,
) -> None:
    """The official client: completions and chat, streamed and not, with stop, echo,
    logprobs and usage, read into its own types; a refusal raised as its BadRequestError
    naming the parameter."""
    import openai

    client = openai.OpenAI(base_url=f"{node.gateway}/v1", api_key="unused", max_retries=0)
    try:
        done = client.completions.create(model="tinyllama", prompt=PROMPT,
                                         max_tokens=MAX_TOKENS, logprobs=TOP)  # fmt: skip
        choice = done.choices[0]
        assert (choice.text, choice.finish_reason) == (expected, "length")
        assert done.usage is not None and done.usage.model_dump(exclude_none=True) == usage_of(
            greedy
        )
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        assert all(close(a, b) for a, b in zip(choice.logprobs.token_logprobs,
                                                greedy.logprobs, strict=True))  # fmt: skip
        echoed = client.completions.create(model="tinyllama", prompt=PROMPT,
                                           max_tokens=MAX_TOKENS, echo=True)  # fmt: skip
        assert echoed.choices[0].text == PROMPT + expected
        pieces, reasons, usage = [], [], None
        for chunk in client.completions.create(
            model="tinyllama", prompt=PROMPT, max_tokens=MAX_TOKENS, stop=[stop],
            stream=True, stream_options={"include_usage": True},
        ):  # fmt: skip
            pieces += [c.text for c in chunk.choices]
            reasons += [c.finish_reason for c in chunk.choices if c.finish_reason]
            usage = chunk.usage or usage
        assert ("".join(pieces), reasons) == (before_stop, ["stop"])
        assert (
            usage is not None and usage.completion_tokens == reference.until_stop(greedy, stop)[1]
        )

        answer = client.chat.completions.create(
            model="tinyllama", messages=CHAT, max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
            logprobs=True, top_logprobs=TOP,
        )  # fmt: skip
        message = answer.choices[0]
        assert message.message.content == reference.text(chat.tokens)
        assert message.logprobs is not None and message.logprobs.content is not None
        assert [t.token for t in message.logprobs.content] == [
            reference.token_text(t) for t in chat.tokens
        ]
        assert answer.usage is not None and answer.usage.model_dump()["total_tokens"] == (
            chat.prompt_tokens + len(chat.tokens)
        )
        stream = client.chat.completions.create(
            model="tinyllama", messages=CHAT, max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
            stream=True,
        )  # fmt: skip
        deltas = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert "".join(deltas) == reference.text(chat.tokens)
        with pytest.raises(openai.BadRequestError) as raised:
            client.completions.create(model="tinyllama", prompt="x", suffix="y")
        assert raised.value.param == "suffix"
    finally:
        client.close()
