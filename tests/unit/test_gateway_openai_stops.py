"""OpenAI completeness in the gateway, pure: stop sequences over streamed text (multibyte
characters split across network chunks included), echo, logprobs, usage and finish
reasons assembled from the model's responses, and what a model's configuration says it
can honour."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelswap_sidecar.gateway import sse
from modelswap_sidecar.gateway.errors import BadRequestError, ModelStreamError
from modelswap_sidecar.gateway.openai import (
    Completion,
    Piece,
    check_support,
    parse_chat,
    parse_completion,
    piece_of,
    token_bytes,
)
from modelswap_sidecar.gateway.stops import StopScanner, first_stop, held_tail


def scan(pieces: list[str], stops: list[str]) -> tuple[list[str], bool]:
    """What a scanner sends for each piece, then its rest; and whether it stopped."""
    scanner = StopScanner(stops)
    sent = [scanner.feed(p) for p in pieces]
    return [*sent, scanner.finish()], scanner.stopped


def test_the_text_ends_before_the_first_stop_sequence() -> None:
    assert scan(["hello world"], ["o w", "ld"]) == (["hell", ""], True)
    # The earliest match wins, whichever sequence it is.
    assert scan(["abcdef"], ["de", "bc"]) == (["a", ""], True)
    # Later pieces are dropped.
    assert scan(["ab", "cd", "ef"], ["c"]) == (["ab", "", "", ""], True)
    assert scan(["no stop here"], ["zz"]) == (["no stop here", ""], False)
    assert scan(["plain"], []) == (["plain", ""], False)


def test_only_a_tail_that_could_start_a_stop_sequence_is_held_back() -> None:
    # "wor" could be the start of "world": held, then released when it is not.
    assert scan(["hello wor", "m"], ["world"]) == (["hello ", "worm", ""], False)
    # A stop sequence spanning three pieces.
    assert scan(["a<", "/", "s>b"], ["</s>"]) == (["a", "", "", ""], True)
    # The held tail is sent at the end when the text ends inside it.
    assert scan(["abc <"], ["</s>"]) == (["abc ", "<"], False)
    # Only as much as could start one: "xx" is not the start of "xy" beyond one "x".
    assert scan(["axx"], ["xy"]) == (["ax", "x"], False)
    assert held_tail("abcab", ["abd"]) == 2
    assert held_tail("abc", ["zz", "q"]) == 0
    assert first_stop("abc", ["", "c"]) == 2


def test_multibyte_stop_sequences_and_characters_are_never_split() -> None:
    # Pieces are characters: a stop made of multibyte characters spanning pieces.
    assert scan(["漢", "字です"], ["字で"]) == (["漢", "", ""], True)
    assert scan(["✓ ok ✓", "✗"], ["✓✗"]) == (["✓ ok ", "", ""], True)
    # The emoji is held as a whole character, then released whole.
    assert scan(["hi 😀", "!"], ["😀?"]) == (["hi ", "😀!", ""], False)


def test_a_multibyte_character_split_between_network_chunks_is_whole_for_the_scanner() -> None:
    """Triton's event stream arrives in network chunks that may split a UTF-8 character;
    the parser decodes a line once it is whole, so the scanner sees whole characters."""
    events = [{"text_output": "caf\u00e9 \u6f22"}, {"text_output": "\u5b57 end"}]
    raw = b"".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n".encode() for e in events)
    for split in range(1, len(raw)):  # every place a chunk may end, inside characters too
        parser, scanner = sse.EventParser(), StopScanner(["\u6f22\u5b57"])
        sent = []
        for chunk in (raw[:split], raw[split:]):
            for event in parser.feed(chunk):
                sent.append(scanner.feed(piece_of(event.data).text))
        assert "".join(sent) == "caf\u00e9 " and scanner.stopped, split
        assert all("\ufffd" not in s for s in sent)


def request(**fields: Any) -> Any:
    body = {"model": "m", "prompt": "Say:", "max_tokens": 4, **fields}
    return parse_completion(body)


def stream_of(completion: Completion, pieces: list[Piece]) -> list[dict[str, Any]]:
    chunks = []
    opening = completion.opening()
    if opening is not None:
        chunks.append(opening)
    for piece in pieces:
        chunk = completion.add(piece)
        if chunk is not None:
            chunks.append(chunk)
        if completion.stopped:
            break
    chunks.append(completion.last_chunk())
    usage = completion.usage_chunk()
    return chunks + ([usage] if usage else [])


PIECES = [
    Piece(" one", None, 1, 3, (" one",), (-0.5,), (" one", " two"), (-0.5, -1.0)),
    Piece(
        " tw",
        None,
        2,
        3,
        (" t", "w"),
        (-0.25, -0.75),
        (" t", " x", "w", "y"),
        (-0.25, -2.0, -0.75, -3.0),
    ),
    Piece("o!", "stop", 1, 3, ("o!",), (-0.125,), ("o!", "?"), (-0.125, -4.0)),
]


def test_a_stop_sequence_ends_the_stream_and_counts_what_was_generated() -> None:
    completion = Completion(request(stream=True, stop=["two"],
                                    stream_options={"include_usage": True}), created=1)  # fmt: skip
    chunks = stream_of(completion, PIECES)
    texts = [c["choices"][0]["text"] for c in chunks[:-1]]
    assert texts == [" one", " ", ""]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert all(c["usage"] is None for c in chunks[:-1])


def test_echo_logprobs_and_usage_of_a_whole_answer() -> None:
    completion = Completion(request(echo=True), created=1)
    for piece in PIECES:
        completion.add(piece)
    answer = completion.response()
    assert answer["choices"][0]["text"] == "Say: one two!"
    assert answer["choices"][0]["finish_reason"] == "stop"  # the model's
    assert answer["usage"]["completion_tokens"] == 4
    completion = Completion(request(logprobs=1), created=1)
    for piece in PIECES:
        completion.add(piece)
    logprobs = completion.response()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [" one", " t", "w", "o!"]
    assert logprobs["token_logprobs"] == [-0.5, -0.25, -0.75, -0.125]
    assert logprobs["top_logprobs"] == [{" one": -0.5}, {" t": -0.25}, {"w": -0.75}, {"o!": -0.125}]
    assert logprobs["text_offset"] == [0, 4, 6, 7]


def test_streamed_logprobs_go_with_the_text_they_cover() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    completion = Completion(parse_chat({**body, "logprobs": True, "top_logprobs": 2}), 1)
    chunks = stream_of(completion, PIECES)
    content = [c["choices"][0]["logprobs"]["content"] for c in chunks]
    assert [[item["token"] for item in c] for c in content] == [[" one"], [" t", "w"], ["o!"], []]
    assert content[1][0]["top_logprobs"] == [
        {"token": " t", "logprob": -0.25, "bytes": [32, 116]},
        {"token": " x", "logprob": -2.0, "bytes": [32, 120]},
    ]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": " one"}
    assert chunks[-1]["choices"][0]["delta"] == {}
    # A token held with text that may start a stop sequence goes with the chunk after it.
    completion = Completion(parse_chat({**body, "logprobs": True, "stop": " twa"}), 1)
    chunks = stream_of(completion, PIECES)
    tokens = [[i["token"] for i in c["choices"][0]["logprobs"]["content"]] for c in chunks]
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == [" one", " two!", None]
    assert tokens == [[" one"], [" t", "w", "o!"], []]


def test_finish_reason_is_length_when_a_token_limit_ended_the_text() -> None:
    plain = [Piece(" a"), Piece(" b")]
    completion = Completion(request(max_tokens=2), created=1)
    for piece in plain:
        completion.add(piece)
    assert completion.response()["choices"][0]["finish_reason"] == "length"
    assert completion.response()["usage"] is None  # the model reported no counts
    completion = Completion(request(max_tokens=3), created=1)
    for piece in plain:
        completion.add(piece)
    assert completion.final_reason() == "stop"
    completion = Completion(request(max_tokens=None), created=1)
    completion.add(Piece(" a", "length", 1, 1))
    assert completion.final_reason() == "length"


def test_token_bytes_reads_openai_s_spelling_of_partial_characters() -> None:
    assert token_bytes("bytes:\\xe6\\xbf") == b"\xe6\xbf"
    assert token_bytes("é") == b"\xc3\xa9"


def test_a_model_s_event_that_breaks_the_contract_is_a_stream_error() -> None:
    assert piece_of('{"text_output": "a", "token_ids": [1, 2], "prompt_tokens": 5}') == Piece(
        "a", None, 2, 5
    )
    for bad in (
        '{"text_output": "a", "prompt_tokens": "five"}',
        '{"text_output": "a", "tokens": ["a", "b"], "logprobs": -1.0}',
        '{"text_output": "a", "tokens": "a", "logprobs": "high"}',
    ):
        with pytest.raises(ModelStreamError):
            piece_of(bad)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop: at most 4"),
        ({"stop": ["a", ""]}, "stop\\[1\\]: must not be empty"),
        ({"stop": ""}, "stop: must not be empty"),
        ({"echo": "yes"}, "echo"),
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options"),
    ],
)
def test_completion_fields_it_cannot_honour_are_refused_naming_them(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(BadRequestError, match=f"^{field}"):
        request(**fields)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"top_logprobs": 2}, "top_logprobs: needs logprobs"),
        ({"logprobs": 1}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"echo": True}, "echo"),
        ({"tool_choice": "auto"}, "tool_choice"),
    ],
)
def test_chat_fields_it_cannot_honour_are_refused_naming_them(
    fields: dict[str, Any], field: str
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(BadRequestError, match=f"^{field}"):
        parse_chat(body)


def config(outputs: list[str], sampling: str | None = None) -> dict[str, Any]:
    parameters = {} if sampling is None else {"sampling_parameters": {"string_value": sampling}}
    return {"output": [{"name": n} for n in outputs], "parameters": parameters}


LLM = config(
    ["text_output", "prompt_tokens", "token_ids", "tokens", "logprobs", "top_tokens",
     "top_logprobs"],
    "temperature, seed",
)  # fmt: skip
TOY = config(["text_output", "prompt_tokens", "token_ids"])


def test_what_a_model_can_honour_comes_from_its_configuration() -> None:
    asks = request(temperature=0.5, seed=3, logprobs=2, stream=True,
                   stream_options={"include_usage": True})  # fmt: skip
    check_support(asks, LLM, "llm")
    assert request().requirements() == []  # nothing asked: the config is not read
    for fields, cfg, field in [
        ({"temperature": 0.5}, TOY, "temperature: model 'toy' does not take it"),
        ({"top_p": 0.5}, LLM, "top_p: model 'toy' does not take it"),
        ({"logprobs": 0}, TOY, "logprobs: model 'toy' cannot give it"),
        ({"logprobs": 2}, config(["tokens", "logprobs"]), "logprobs: .*top_tokens"),
        (
            {"stream": True, "stream_options": {"include_usage": True}},
            config(["text_output"]),
            "stream_options.include_usage: .*prompt_tokens, token_ids",
        ),
    ]:
        with pytest.raises(BadRequestError, match=f"^{field}"):
            check_support(request(**fields), cfg, "toy")
    chat = parse_chat({"model": "m", "messages": [{"role": "u", "content": "x"}],
                       "logprobs": True, "top_logprobs": 1})  # fmt: skip
    with pytest.raises(BadRequestError, match=r"^top_logprobs"):
        check_support(chat, config(["tokens", "logprobs"]), "toy")
    with pytest.raises(BadRequestError, match=r"^temperature"):
        check_support(request(temperature=1), None, "toy")  # no configuration: nothing


def test_a_refusal_names_its_field_in_param_as_openai_does() -> None:
    from modelswap_sidecar.gateway.openai import error_body

    for message, param in [
        ("logprobs: model 'toy' cannot give it", "logprobs"),
        ("stop[1]: must not be empty", "stop[1]"),
        ("stream_options.include_usage: model 'x' cannot give it", "stream_options.include_usage"),
        ("messages[0].content: only text parts are supported", "messages[0].content"),
        ("the body must be a JSON object", None),
        ("model 'x' names namespace 'a' but the path names 'b'", None),
    ]:
        assert error_body(message, 400, "BadRequest")["error"]["param"] == param, message
    assert error_body("logprobs: x", 503, "QueueTimeout")["error"]["param"] is None
