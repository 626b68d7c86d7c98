"""OpenAI embeddings requests to Triton infer bodies, Triton's answers back to OpenAI's
shape, and the model contract check (pure)."""

from __future__ import annotations

import array
import base64
import json
import struct
from typing import Any

import pytest

from modelswap_sidecar.gateway.embeddings import (
    MAX_INPUTS,
    CheckedModels,
    EmbeddingRequest,
    Embeddings,
    check_contract,
    check_dimensions,
    embeddings_of,
    parse_embeddings,
    response_body,
    response_pieces,
)
from modelswap_sidecar.gateway.errors import (
    BadModelAnswerError,
    BadRequestError,
    NotAnEmbeddingModelError,
)


def test_a_string_or_a_list_of_strings_becomes_the_request() -> None:
    one = parse_embeddings({"model": "embed", "input": "hello"})
    assert one == EmbeddingRequest("embed", ("hello",), "float", None)
    many = parse_embeddings(
        {
            "model": "team-a/embed",
            "input": ["a", "b c"],
            "encoding_format": "base64",
            "dimensions": 384,
            "user": "someone",
        }
    )
    assert many == EmbeddingRequest("team-a/embed", ("a", "b c"), "base64", 384)
    assert (
        parse_embeddings({"model": "m", "input": "x", "encoding_format": None}).encoding_format
        == "float"
    )
    assert len(parse_embeddings({"model": "m", "input": ["x"] * MAX_INPUTS}).texts) == MAX_INPUTS


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "the body"),
        ({"input": "x"}, "model"),
        ({"model": "", "input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": None}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": ""}, r"input\[0\]"),
        ({"model": "m", "input": ["a", ""]}, r"input\[1\]"),
        ({"model": "m", "input": [1, 2, 3]}, "input: token ids"),
        ({"model": "m", "input": [[1, 2], [3]]}, "input: token ids"),
        ({"model": "m", "input": ["a", 7]}, "input: token ids"),
        ({"model": "m", "input": ["a", 1.5]}, r"input\[1\]"),
        ({"model": "m", "input": ["a", {"text": "b"}]}, r"input\[1\]"),
        ({"model": "m", "input": {"text": "a"}}, "input"),
        ({"model": "m", "input": 5}, "input"),
        ({"model": "m", "input": "a\ud800b"}, r"input\[0\]: holds a lone surrogate at 1"),
        ({"model": "m", "input": ["x"] * (MAX_INPUTS + 1)}, f"input: at most {MAX_INPUTS}"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "m", "input": "x", "encoding_format": 1}, "encoding_format"),
        ({"model": "m", "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "m", "input": "x", "dimensions": -3}, "dimensions"),
        ({"model": "m", "input": "x", "dimensions": 1.5}, "dimensions"),
        ({"model": "m", "input": "x", "dimensions": True}, "dimensions"),
        ({"model": "m", "input": "x", "dimensions": "384"}, "dimensions"),
        ({"model": "m", "input": "x", "user": 42}, "user"),
    ],
)
def test_bad_embeddings_requests_name_the_field(body: object, field: str) -> None:
    with pytest.raises(BadRequestError, match=f"^{field}"):
        parse_embeddings(body)


def test_the_infer_request_carries_the_strings_as_binary_bytes() -> None:
    texts = ("hello", "é😀", 'quote " and \\ and \x00 nul')
    body, header_length = EmbeddingRequest("m", texts).infer_request()
    header = json.loads(body[:header_length])
    data = body[header_length:]
    assert header == {
        "inputs": [
            {
                "name": "text_input",
                "shape": [3],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(data)},
            }
        ],
        "outputs": [
            {"name": "embedding", "parameters": {"binary_data": True}},
            {"name": "prompt_tokens", "parameters": {"binary_data": False}},
        ],
    }
    decoded, offset = [], 0
    while offset < len(data):
        (size,) = struct.unpack_from("<I", data, offset)
        decoded.append(data[offset + 4 : offset + 4 + size].decode())
        offset += 4 + size
    assert tuple(decoded) == texts


def config(inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], batch: int = 0) -> Any:
    return {"name": "m-1", "max_batch_size": batch, "input": inputs, "output": outputs}


TEXT = {"name": "text_input", "data_type": "TYPE_STRING", "dims": [-1], "optional": False}
EMBEDDING = {"name": "embedding", "data_type": "TYPE_FP32", "dims": [-1, -1]}
TOKENS = {"name": "prompt_tokens", "data_type": "TYPE_INT64", "dims": [-1]}


def test_a_configuration_that_keeps_the_contract_passes() -> None:
    check_contract(config([TEXT], [EMBEDDING, TOKENS]), "embed")
    fixed_width = {**EMBEDDING, "dims": [-1, 384]}
    optional_extra = {"name": "pooling", "data_type": "TYPE_STRING", "dims": [1], "optional": True}
    extra_output = {"name": "debug", "data_type": "TYPE_FP32", "dims": [-1]}
    check_contract(config([TEXT, optional_extra], [fixed_width, TOKENS, extra_output]), "embed")
    as_strings = {**TEXT, "dims": ["-1"]}  # protobuf's JSON form of int64
    check_contract(config([as_strings], [EMBEDDING, TOKENS]), "embed")


@pytest.mark.parametrize(
    ("model_config", "named"),
    [
        (config([], [EMBEDDING, TOKENS]), ["no input text_input (TYPE_STRING, dims [-1])"]),
        (config([TEXT], [TOKENS]), ["no output embedding (TYPE_FP32, dims [-1, -1])"]),
        (config([TEXT], [EMBEDDING]), ["no output prompt_tokens (TYPE_INT64, dims [-1])"]),
        (
            config([{**TEXT, "data_type": "TYPE_INT32"}], [EMBEDDING, TOKENS]),
            ["input text_input is TYPE_INT32 with dims [-1], not TYPE_STRING with dims [-1]"],
        ),
        (
            config([{**TEXT, "dims": [1]}], [EMBEDDING, TOKENS]),
            ["input text_input is TYPE_STRING with dims [1], not TYPE_STRING with dims [-1]"],
        ),
        (
            config([TEXT], [{**EMBEDDING, "dims": [-1]}, TOKENS]),
            ["output embedding is TYPE_FP32 with dims [-1], not TYPE_FP32 with dims [-1, -1]"],
        ),
        (
            config([TEXT], [{**EMBEDDING, "data_type": "TYPE_FP16"}, TOKENS]),
            ["output embedding is TYPE_FP16"],
        ),
        (
            config([TEXT], [EMBEDDING, {**TOKENS, "data_type": "TYPE_INT32"}]),
            ["output prompt_tokens is TYPE_INT32"],
        ),
        (config([TEXT], [EMBEDDING, TOKENS], batch=8), ["max_batch_size must be 0, not 8"]),
        (
            config(
                [TEXT, {"name": "mask", "data_type": "TYPE_INT64", "dims": [-1]}],
                [EMBEDDING, TOKENS],
            ),
            ["input mask is required, but the gateway sends only text_input"],
        ),
        (
            config(
                [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
            ),
            [
                "no input text_input",
                "no output embedding",
                "no output prompt_tokens",
                "input INPUT0 is required",
            ],
        ),
        (["not", "an", "object"], ["Triton gave no configuration"]),
        ({"input": "junk", "output": [1, None]}, ["no input text_input", "no output embedding"]),
    ],
)
def test_a_configuration_without_the_contract_is_refused_naming_all_it_lacks(
    model_config: Any, named: list[str]
) -> None:
    with pytest.raises(NotAnEmbeddingModelError) as raised:
        check_contract(model_config, "embed")
    assert raised.value.message.startswith("embed")
    assert raised.value.status == 400 and raised.value.reason == "NotAnEmbeddingModel"
    for part in named:
        assert part in raised.value.message


def triton_answer(
    rows: list[list[float]],
    tokens: list[int],
    *,
    shape: list[int] | None = None,
    datatype: str = "FP32",
    binary_tokens: bool = False,
) -> tuple[bytes, int]:
    """An answer as Triton writes it to `infer_request`: embedding as binary data."""
    blob = array.array("f", [v for row in rows for v in row]).tobytes()
    width = len(rows[0]) if rows else 0
    outputs: list[dict[str, Any]] = [
        {
            "name": "embedding",
            "datatype": datatype,
            "shape": shape or [len(rows), width],
            "parameters": {"binary_data_size": len(blob)},
        }
    ]
    token_output: dict[str, Any] = {
        "name": "prompt_tokens",
        "datatype": "INT64",
        "shape": [len(tokens)],
    }
    if binary_tokens:
        token_blob = array.array("q", tokens).tobytes()
        token_output["parameters"] = {"binary_data_size": len(token_blob)}
        blob += token_blob
    else:
        token_output["data"] = tokens
    outputs.append(token_output)
    header = json.dumps({"model_name": "m-1", "model_version": "1", "outputs": outputs}).encode()
    return header + blob, len(header)


def test_triton_answer_becomes_rows_and_a_token_count() -> None:
    rows = [[0.5, -0.25, 1.0], [0.1, 0.2, 0.3]]
    body, length = triton_answer(rows, [4, 7])
    result = embeddings_of(body, length, 2)
    assert (result.count, result.width, result.prompt_tokens) == (2, 3, 11)
    assert result.rows == array.array("f", [v for row in rows for v in row]).tobytes()
    body, length = triton_answer(rows, [4, 7], binary_tokens=True)
    assert embeddings_of(body, length, 2).prompt_tokens == 11
    # Data as JSON numbers (no binary part) is read as well.
    as_json = {
        "outputs": [
            {"name": "embedding", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 0.25]},
            {"name": "prompt_tokens", "datatype": "INT64", "shape": [1], "data": [3]},
        ]
    }
    result = embeddings_of(json.dumps(as_json).encode(), None, 1)
    assert result.rows == array.array("f", [0.5, 0.25]).tobytes() and result.prompt_tokens == 3


def _header_with(body: bytes, length: int, change: Any) -> tuple[bytes, int]:
    header = json.loads(body[:length])
    change(header)
    new = json.dumps(header).encode()
    return new + body[length:], len(new)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (lambda: triton_answer([[1.0, 2.0]], [1]), "is FP32 of shape [1, 2], not FP32 of shape [2"),
        (lambda: triton_answer([[1.0], [2.0]], [1, 1], datatype="FP16"), "embedding is FP16"),
        (lambda: triton_answer([[1.0], [2.0]], [1, 1], shape=[2]), "of shape [2], not"),
        (lambda: triton_answer([[], []], [1, 1]), "of shape [2, 0], not"),
        (lambda: triton_answer([[1.0], [2.0]], [1]), "prompt_tokens is INT64 of shape [1]"),
        (lambda: triton_answer([[1.0], [2.0]], [1, -1]), "negative count"),
        (
            lambda: _header_with(
                *triton_answer([[1.0], [2.0]], [1, 1]), lambda h: h["outputs"].pop()
            ),
            "lacks embedding or prompt_tokens",
        ),
        (
            lambda: _header_with(
                *triton_answer([[1.0], [2.0]], [1, 1]),
                lambda h: h["outputs"][0]["parameters"].update(binary_data_size=4),
            ),
            "embedding has 4 bytes of data, not 8",
        ),
        (
            lambda: _header_with(
                *triton_answer([[1.0], [2.0]], [1, 1]),
                lambda h: h["outputs"][0]["parameters"].update(binary_data_size=4000),
            ),
            "bad binary_data_size 4000",
        ),
        (
            lambda: _header_with(
                *triton_answer([[1.0], [2.0]], [1, 1]), lambda h: h["outputs"][1].update(data=[1])
            ),
            "prompt_tokens carries no data for 2 values",
        ),
        (
            lambda: _header_with(
                *triton_answer([[1.0], [2.0]], [1, 1]),
                lambda h: h["outputs"][1].update(data=[1, "x"]),
            ),
            "not a number",
        ),
        (lambda: (b"<html>", None), "header is not JSON"),
        (lambda: (b"{}", None), "has no outputs"),
        (lambda: (b"{}", 99), "header length 99 exceeds"),
    ],
)
def test_an_answer_that_breaks_the_contract_is_a_bad_model_answer(
    answer: Any, message: str
) -> None:
    body, length = answer()
    with pytest.raises(BadModelAnswerError) as raised:
        embeddings_of(body, length, 2)
    assert message in raised.value.message
    assert raised.value.status == 502


def test_dimensions_must_be_the_models_width() -> None:
    check_dimensions(EmbeddingRequest("m", ("x",), dimensions=None), 384)
    check_dimensions(EmbeddingRequest("m", ("x",), dimensions=384), 384)
    with pytest.raises(BadRequestError, match=r"^dimensions: m answers 384 dimensions"):
        check_dimensions(EmbeddingRequest("m", ("x",), dimensions=128), 384)


def test_the_answer_has_openais_shape_as_floats_or_base64() -> None:
    values = [0.1, -0.2, 0.3, 1.0 / 3.0, 2.5, -7.0]
    rows = array.array("f", values)
    result = Embeddings(rows.tobytes(), 2, 3, 9)
    answer = json.loads(response_body(EmbeddingRequest("team-a/embed", ("a", "b")), result))
    exact = rows.tolist()  # the float32 values, as doubles
    assert answer == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": exact[:3]},
            {"object": "embedding", "index": 1, "embedding": exact[3:]},
        ],
        "model": "team-a/embed",
        "usage": {"prompt_tokens": 9, "total_tokens": 9},
    }
    encoded = json.loads(response_body(EmbeddingRequest("embed", ("a", "b"), "base64"), result))
    decoded = [
        array.array("f", base64.b64decode(entry["embedding"])).tolist() for entry in encoded["data"]
    ]
    assert decoded == [exact[:3], exact[3:]]
    assert [entry["index"] for entry in encoded["data"]] == [0, 1]
    assert encoded["model"] == "embed" and encoded["usage"]["total_tokens"] == 9


def test_a_large_answer_comes_in_pieces_that_join_to_valid_json() -> None:
    width, count = 8, 50
    rows = array.array("f", [i / 7 for i in range(width * count)])
    result = Embeddings(rows.tobytes(), count, width, count)
    request = EmbeddingRequest('we"ird\u00e9', ("x",) * count)
    pieces = list(response_pieces(request, result, values_per_piece=80))
    assert len(pieces) == 1 + count * width // 80 + 1  # head, full pieces, the tail
    answer = json.loads(b"".join(pieces))
    assert answer["model"] == 'we"ird\u00e9'
    assert [e["index"] for e in answer["data"]] == list(range(count))
    assert answer["data"][49]["embedding"] == rows[49 * width :].tolist()


def test_checked_models_are_bounded_and_forgotten() -> None:
    checked = CheckedModels(limit=2)
    for name in ("m-1", "m-2", "m-3"):
        checked.add(name)
    assert "m-1" not in checked and "m-2" in checked and "m-3" in checked
    checked.forget("m-2")
    checked.forget("m-9")
    assert "m-2" not in checked
