"""OpenAI requests to generate_stream bodies and responses back to OpenAI chunks (pure)."""

from __future__ import annotations

import json

import pytest

from modelswap_sidecar.gateway.errors import BadRequestError, ModelStreamError
from modelswap_sidecar.gateway.openai import (
    Completion,
    chat_prompt,
    error_body,
    parse_chat,
    parse_completion,
    text_of,
)


def test_a_completion_becomes_a_generate_body_with_request_parameters() -> None:
    request = parse_completion(
        {
            "model": "llama",
            "prompt": "hello world",
            "max_tokens": 5,
            "temperature": 0.5,
            "stop": ["\n", "."],
            "user": "ignored",
        }
    )
    assert request.stream is False
    assert request.generate_body() == {
        "text_input": "hello world",
        "parameters": {"max_tokens": 5, "temperature": 0.5, "stop": json.dumps(["\n", "."])},
    }
    assert parse_completion({"model": "m", "prompt": ["one"]}).prompt == "one"
    assert parse_completion({"model": "m", "prompt": "x"}).generate_body() == {"text_input": "x"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "the body"),
        ({"prompt": "x"}, "model"),
        ({"model": "m", "prompt": [1, 2]}, "prompt"),
        ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
        ({"model": "m", "prompt": "x", "n": 2}, "n"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"model": "m", "prompt": "x", "temperature": "hot"}, "temperature"),
        ({"model": "m", "prompt": "x", "stop": 3}, "stop"),
        ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
    ],
)
def test_bad_completions_name_the_field(body: object, field: str) -> None:
    with pytest.raises(BadRequestError, match=f"^{field}"):
        parse_completion(body)


def test_chat_messages_render_into_one_prompt() -> None:
    request = parse_chat(
        {
            "model": "llama",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}],
                },
            ],
            "max_completion_tokens": 3,
            "stream": True,
        }
    )
    assert request.prompt == "system: Be brief.\nuser: hi there\nassistant:"
    assert request.max_tokens == 3 and request.stream
    with pytest.raises(BadRequestError, match=r"^messages\[0\].content"):
        chat_prompt([{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(BadRequestError, match=r"^messages"):
        parse_chat({"model": "m", "messages": []})
    with pytest.raises(BadRequestError, match=r"^tools"):
        parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{}]})


def test_stream_events_give_text_or_raise_the_models_error() -> None:
    assert text_of('{"model_name":"m","text_output":" A"}') == (" A", None)
    assert text_of('{"text_output":["a","b"],"finish_reason":["stop"]}') == ("ab", "stop")
    with pytest.raises(ModelStreamError, match="boom"):
        text_of('{"error":"boom"}')
    with pytest.raises(ModelStreamError, match="not JSON"):
        text_of("nope")


def test_completion_chunks_and_aggregate() -> None:
    completion = Completion(
        parse_completion({"model": "llama", "prompt": "a b", "max_tokens": 2}), created=7
    )
    first = completion.add(" A")
    completion.add(" B")
    assert first["object"] == "text_completion"
    assert first["choices"][0] == {
        "index": 0,
        "text": " A",
        "logprobs": None,
        "finish_reason": None,
    }
    assert completion.last_chunk()["choices"][0]["finish_reason"] == "length"
    whole = completion.response()
    assert whole["model"] == "llama" and whole["created"] == 7
    assert whole["choices"][0]["text"] == " A B"
    assert whole["id"] == first["id"]


def test_chat_chunks_carry_the_role_first_then_content() -> None:
    request = parse_chat(
        {"model": "llama", "messages": [{"role": "user", "content": "x"}], "stream": True}
    )
    completion = Completion(request, created=1)
    assert completion.add(" X")["choices"][0]["delta"] == {"role": "assistant", "content": " X"}
    assert completion.add(" Y")["choices"][0]["delta"] == {"content": " Y"}
    last = completion.last_chunk()["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] == "stop"
    assert completion.response()["choices"][0]["message"] == {
        "role": "assistant",
        "content": " X Y",
    }


def test_error_bodies_follow_openai() -> None:
    assert error_body("no", 404, "ModelNotFound")["error"]["type"] == "invalid_request_error"
    assert error_body("down", 503, "QueueTimeout")["error"] == {
        "message": "down",
        "type": "server_error",
        "param": None,
        "code": "QueueTimeout",
    }


def test_text_with_a_lone_surrogate_is_refused_naming_the_field() -> None:
    """`"\\ud800"` is legal JSON that names no character; sent on, Triton's reader failed on
    it with a 500 (the fuzz run, tests/integration/test_reliability_fuzz.py, found it)."""
    lone = json.loads('"a\\ud800"')
    cases = [
        (parse_completion, {"model": "m", "prompt": lone}, "prompt: holds a lone surrogate at 1"),
        (parse_completion, {"model": "m", "prompt": "x", "stop": lone}, "stop: holds"),
        (parse_completion, {"model": "m", "prompt": "x", "stop": ["a", lone]}, "stop\\[1\\]: "),
        (parse_chat, {"model": "m", "messages": [{"role": "user", "content": lone}]},
         "messages\\[0\\].content: holds a lone surrogate"),
        (parse_chat, {"model": "m", "messages": [{"role": lone, "content": "x"}]},
         "messages\\[0\\].role: holds"),
        (parse_chat, {"model": "m", "messages": [
            {"role": "user", "content": [{"type": "text", "text": lone}]}]},
         "messages\\[0\\].content: holds"),
    ]  # fmt: skip
    for parse, body, words in cases:
        with pytest.raises(BadRequestError, match=words):
            parse(body)
    # a pair is one character, and passes
    paired = json.loads('"\\ud83d\\ude00"')
    assert parse_completion({"model": "m", "prompt": paired}).prompt == "\U0001f600"
