"""What a v2 inference request may make Triton allocate (`gateway.tensors`, pure), and error
messages fit for a client (`rewrite.public_message`)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from modelswap_sidecar.gateway.errors import BadRequestError
from modelswap_sidecar.gateway.rewrite import public_message, rename_json, triton_message
from modelswap_sidecar.gateway.tensors import (
    check_config,
    check_generate_config,
    header_length,
    json_object,
    model_shape,
    parse_infer,
)

#: Triton's configuration JSON of tests/data/gateway_models/batched (dims as protobuf's
#: JSON may write them: int64 as strings).
BATCHED_CONFIG = {
    "name": "m-1",
    "max_batch_size": 4,
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": ["2", "3"]},
        {"name": "LABEL", "data_type": "TYPE_STRING", "dims": [-1], "optional": True},
    ],
}


def body(*inputs: dict[str, Any], **fields: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **fields}).encode()


def tensor(name: str, shape: list[int], datatype: str = "FP32", **fields: Any) -> dict[str, Any]:
    return {"name": name, "shape": shape, "datatype": datatype, **fields}


def binary(header: dict[str, Any], data: bytes) -> tuple[bytes, str]:
    raw = json.dumps(header).encode()
    return raw + data, str(len(raw))


def refused(raw: bytes, length: str | None = None) -> str:
    with pytest.raises(BadRequestError) as e:
        parse_infer(raw, length)
    return e.value.message


def test_the_shape_that_crashed_triton_is_refused_naming_the_input() -> None:
    """`[1000000, 1000000]` FP32 with one value had Triton allocate 4 TB and abort."""
    message = refused(body(tensor("INPUT0", [1000000, 1000000], data=[1])))
    assert message == (
        "input 'INPUT0': shape [1000000, 1000000] holds 1000000000000 elements, but data has 1"
    )


def test_json_data_flat_or_nested_must_hold_exactly_the_shape() -> None:
    flat = parse_infer(body(tensor("INPUT0", [2, 3], data=[1, 2, 3, 4, 5, 6])), None)
    nested = parse_infer(body(tensor("INPUT0", [2, 3], data=[[1, 2, 3], [4, 5, 6]])), None)
    assert flat.inputs[0].shape == nested.inputs[0].shape == (2, 3)
    assert flat.inputs[0].elements == 6 and flat.inputs[0].binary_bytes is None
    strings = parse_infer(body(tensor("T", [2], "BYTES", data=["a", ""])), None)
    assert strings.inputs[0].datatype == "BYTES"
    assert "holds 6 elements, but data has 7" in refused(
        body(tensor("INPUT0", [2, 3], data=[[1, 2, 3], [4, 5, 6, 7]]))
    )
    assert "neither data nor binary_data_size" in refused(body(tensor("INPUT0", [1])))
    empty = parse_infer(body(tensor("INPUT0", [0], data=[])), None)
    assert empty.inputs[0].elements == 0


def test_binary_data_must_be_the_shape_times_the_element_size_and_fill_the_body() -> None:
    header = {"inputs": [tensor("INPUT0", [2, 3], parameters={"binary_data_size": 24})]}
    raw, length = binary(header, struct.pack("<6f", *range(6)))
    assert parse_infer(raw, length).inputs[0].binary_bytes == 24
    # a shape far larger than the bytes sent
    header = {"inputs": [tensor("INPUT0", [1 << 40], parameters={"binary_data_size": 4})]}
    raw, length = binary(header, b"\0" * 4)
    assert "is 4398046511104 bytes, but binary_data_size is 4" in refused(raw, length)
    # sizes that do not add up to the bytes after the header
    header = {"inputs": [tensor("INPUT0", [1], parameters={"binary_data_size": 4})]}
    raw, length = binary(header, b"\0" * 8)
    assert "add up to 4 bytes, but 8 bytes follow" in refused(raw, length)
    raw, length = binary(header, b"")
    assert "add up to 4 bytes, but 0 bytes follow" in refused(raw, length)
    # binary data without a header length: the whole body is the header, and not JSON
    assert "not JSON" in refused(raw + b"\0\0\0\0")
    for bad in (-1, True, "4", 1.5):
        header = {"inputs": [tensor("INPUT0", [1], parameters={"binary_data_size": bad})]}
        raw, length = binary(header, b"")
        assert "binary_data_size must be a non-negative integer" in refused(raw, length)


def test_bytes_binary_data_needs_four_bytes_per_string_at_least() -> None:
    data = struct.pack("<I", 1) + b"a" + struct.pack("<I", 0)
    header = {"inputs": [tensor("T", [2], "BYTES", parameters={"binary_data_size": len(data)})]}
    raw, length = binary(header, data)
    assert parse_infer(raw, length).inputs[0].binary_bytes == 9
    header = {"inputs": [tensor("T", [1 << 30], "BYTES", parameters={"binary_data_size": 9})]}
    raw, length = binary(header, data)
    assert "holds 1073741824 strings, but its 9 bytes" in refused(raw, length)


def test_the_header_length_is_ascii_digits_within_the_body() -> None:
    assert header_length(None, 10) is None
    assert header_length(" 7 ", 10) == 7
    for text in ("²", "٣", "-1", "1e3", "", "0x10"):
        with pytest.raises(BadRequestError, match="not a decimal number of bytes"):
            header_length(text, 10)
    with pytest.raises(BadRequestError, match="exceeds the body"):
        header_length("11", 10)
    assert "not a decimal number" in refused(body(tensor("INPUT0", [1], data=[1])), "²")


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        pytest.param(body(tensor("I", [1], data=[1])).decode().encode("utf-16"), "not UTF-8",
                     id="utf-16"),
        pytest.param(b'{"inputs": [', "not JSON", id="malformed"),
        pytest.param(b"", "not JSON", id="empty"),
        pytest.param(b"[1, 2]", "must be a JSON object, not list", id="list"),
        pytest.param(b'{"inputs": {}}', "inputs: must be a list", id="inputs-object"),
        pytest.param(b'{"inputs": [7]}', "inputs[0]: must be an object", id="input-number"),
        pytest.param(body({"shape": [1], "datatype": "FP32", "data": [1]}),
                     "inputs[0]: name must be a string", id="no-name"),
        pytest.param(body(tensor("I", [1], "FP128", data=[1])), "'FP128' is not a v2 datatype",
                     id="datatype"),
        pytest.param(body(tensor("I", [-1], data=[1])), "non-negative integers", id="negative"),
        pytest.param(body(tensor("I", [True], data=[1])), "non-negative integers", id="bool"),
        pytest.param(body(tensor("I", [1.0], data=[1])), "non-negative integers", id="float"),
        pytest.param(body(tensor("I", [1], data=[1]), tensor("I", [1], data=[1])),
                     "input 'I' is given more than once", id="twice"),
        pytest.param(body(tensor("I", [1], data=[1], parameters=[])),
                     "parameters must be an object", id="parameters"),
    ],
)  # fmt: skip
def test_bodies_that_are_not_an_inference_request_are_refused(raw: bytes, words: str) -> None:
    assert words in refused(raw)


def test_shared_memory_is_refused_on_inputs_and_outputs() -> None:
    region = {"shared_memory_region": "weights", "shared_memory_byte_size": 8}
    message = refused(body(tensor("INPUT0", [2], parameters=region)))
    assert message.startswith("input 'INPUT0': shared memory (shared_memory_region) is not")
    ok = tensor("INPUT0", [1], data=[1])
    message = refused(body(ok, outputs=[{"name": "OUTPUT0", "parameters": region}]))
    assert message.startswith("output 'OUTPUT0': shared memory")
    assert "outputs: must be a list" in refused(body(ok, outputs={}))
    assert parse_infer(body(ok, outputs=[{"name": "OUTPUT0"}]), None).inputs[0].name == "INPUT0"


def test_a_long_name_is_cut_in_messages() -> None:
    message = refused(body(tensor("x" * 10_000, [2], data=[1])))
    assert len(message) < 200 and "…" in message


def test_generate_bodies_must_be_json_objects() -> None:
    assert json_object(b'{"text_input": "hi"}', "the request's JSON") == {"text_input": "hi"}
    with pytest.raises(BadRequestError, match="the request's JSON is not UTF-8"):
        json_object('{"text_input": "hi"}'.encode("utf-16"), "the request's JSON")
    with pytest.raises(BadRequestError, match="must be a JSON object, not str"):
        json_object(b'"hi"', "the request's JSON")


def test_the_configuration_bounds_rank_dims_batch_and_datatype() -> None:
    shape = model_shape(BATCHED_CONFIG)
    assert shape is not None and shape.max_batch_size == 4
    assert shape.inputs["INPUT0"].dims == (2, 3) and shape.inputs["LABEL"].datatype == "BYTES"
    largest = parse_infer(
        body(tensor("INPUT0", [4, 2, 3], data=[0] * 24), tensor("LABEL", [4, 5], "BYTES",
                                                                data=["a"] * 20)), None
    )  # fmt: skip
    check_config(largest, shape, "batched")  # the largest the configuration allows

    def config_refuses(*inputs: dict[str, Any]) -> str:
        with pytest.raises(BadRequestError) as e:
            check_config(parse_infer(body(*inputs), None), shape, "batched")
        return e.value.message

    assert config_refuses(tensor("INPUT0", [5, 2, 3], data=[0] * 30)) == (
        "input 'INPUT0': shape [5, 2, 3] has a batch of 5; batched takes at most 4 "
        "(shape [batch, *[2, 3]])"
    )
    assert config_refuses(tensor("INPUT0", [1, 2, 4], data=[0] * 8)) == (
        "input 'INPUT0': shape [1, 2, 4] does not fit batched's dims [-1, 2, 3]"
    )
    assert "does not fit" in config_refuses(tensor("INPUT0", [2, 6], data=[0] * 12))
    assert "has a batch of none" in config_refuses(tensor("INPUT0", [], data=[0]))
    assert config_refuses(tensor("INPUT0", [1, 2, 3], "FP64", data=[0] * 6)) == (
        "input 'INPUT0': batched takes FP32, not FP64"
    )
    assert config_refuses(tensor("OTHER", [1], data=[0])) == (
        "input 'OTHER': batched has no such input (it has INPUT0, LABEL)"
    )
    unbatched = model_shape({"max_batch_size": 0, "input": [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})  # fmt: skip
    assert unbatched is not None
    check_config(parse_infer(body(tensor("INPUT0", [7], data=[0] * 7)), None), unbatched, "p")
    with pytest.raises(BadRequestError, match=r"does not fit p's dims \[-1\]"):
        check_config(parse_infer(body(tensor("INPUT0", [1, 7], data=[0] * 7)), None), unbatched,
                     "p")  # fmt: skip


def test_a_configuration_the_gateway_cannot_read_bounds_nothing_more() -> None:
    assert model_shape(None) is None
    assert model_shape({"name": "m"}) is None  # no inputs listed
    assert model_shape({"input": [{"dims": [1]}]}) is None  # no name
    assert model_shape({"input": [{"name": "I", "dims": ["x"]}]}) is None


STUB_FAILURE = (
    "Failed to process the request(s) for model 'm-1_0_0', message: RuntimeError: the "
    "batched toy was asked to fail\n\nAt:\n  /var/lib/modelswap/repository/m-1/1/model.py(21)"
    ": execute\n  /opt/tritonserver/backends/python/stub.py(7): run\n"
)


def test_error_messages_lose_stub_tracebacks_and_internal_paths() -> None:
    assert public_message(STUB_FAILURE) == (
        "Failed to process the request(s) for model 'm-1_0_0', message: RuntimeError: the "
        "batched toy was asked to fail"
    )
    python = (
        'Traceback (most recent call last):\n  File "/srv/app/model.py", line 3, in execute\n'
        "    raise ValueError(x)\nValueError: bad input"
    )
    assert public_message(python) == "ValueError: bad input"
    assert public_message("cannot open '/home/u/.cache/weights.bin': denied") == (
        "cannot open 'weights.bin': denied"
    )
    kept = "see http://example.com/a/b and /v2 and ratio 1/2"
    assert public_message(kept) == kept
    raw = json.dumps({"error": STUB_FAILURE}).encode()
    renamed = json.loads(rename_json(raw, "m-1", "batched"))["error"]
    assert "At:" not in renamed and "/var/lib" not in renamed and "batched_0_0" in renamed
    assert triton_message(b"data: " + raw) == public_message(STUB_FAILURE)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        pytest.param(body(tensor("L", [1], "BYTES", data=["\ud800"])),
                     "lone UTF-16 surrogate (\\ud800)", id="lone-surrogate"),
        pytest.param(body(tensor("I", [1], data=[1]), parameters=[{}]),
                     "parameters must be an object", id="request-parameters-list"),
        pytest.param(body(tensor("I", [1], data=[1]), parameters={"sequence_id": 2**70}),
                     "parameters.sequence_id: must be a string or an unsigned 64-bit integer",
                     id="sequence-id"),
        pytest.param(body(tensor("I", [1], data=[1]), parameters={"priority": -1}),
                     "parameters.priority: must be an unsigned 64-bit integer", id="priority"),
        pytest.param(body(tensor("I", [1], data=[1]), parameters={"timeout": "1"}),
                     "parameters.timeout: must be", id="timeout"),
        pytest.param(body(tensor("I", [1], data=[1]), parameters={"sequence_start": "yes"}),
                     "parameters.sequence_start: must be true or false", id="sequence-start"),
        pytest.param(body(tensor("I", [1], data=[1]), parameters={"binary_data_output": 1}),
                     "parameters.binary_data_output: must be true or false", id="binary-output"),
        pytest.param(body(tensor("I", [1], data=[1]), id=5), "id: must be a string", id="id"),
        pytest.param(body(tensor("I", [1], data=[1]), outputs=[{"name": 5}]),
                     "outputs[0]: name must be a string", id="output-name"),
        pytest.param(body(tensor("I", [1], data=[1]), outputs=[{"name": "O", "parameters": 1}]),
                     "output 'O': parameters must be an object", id="output-parameters"),
        pytest.param(body(tensor("I", [1], data=[1]),
                          outputs=[{"name": "O", "parameters": None}]),
                     "output 'O': parameters must be an object", id="output-parameters-null"),
        pytest.param(body(tensor("I", [1], data=[1]), parameters=None),
                     "parameters must be an object", id="request-parameters-null"),
        pytest.param(body(tensor("I", [1], data=[1]),
                          outputs=[{"name": "O", "parameters": {"binary_data": "true"}}]),
                     "output 'O': parameters.binary_data: must be true or false",
                     id="output-binary"),
        pytest.param(body(tensor("I", [1], data=[1]),
                          outputs=[{"name": "O", "parameters": {"classification": 2**64}}]),
                     "parameters.classification: must be an unsigned 64-bit integer",
                     id="classification"),
        pytest.param(body(tensor("I", [2], data=["a", "b"])),
                     "input 'I': data holds \"a\"; FP32 data must be numbers", id="fp32-strings"),
        pytest.param(body(tensor("I", [2], data=[True, 1.0])), "FP32 data must be numbers",
                     id="fp32-bool"),
        pytest.param(body(tensor("I", [2], data=[None, 1.0])), "FP32 data must be numbers",
                     id="fp32-null"),
        pytest.param(body(tensor("I", [2], "BYTES", data=["a", 5])),
                     "data holds 5; BYTES data must be strings", id="bytes-number"),
        pytest.param(body(tensor("I", [1], "BOOL", data=[1])), "BOOL data must be true or false",
                     id="bool-number"),
        pytest.param(body(tensor("I", [1], "INT32", data=[1.5])),
                     "INT32 data must be integers within 64 bits", id="int-float"),
        pytest.param(body(tensor("I", [1], "INT64", data=[2**63])),
                     "INT64 data must be integers within 64 bits", id="int-past-64-bits"),
        pytest.param(body(tensor("I", [1], "UINT8", data=[-1])),
                     "UINT8 data must be non-negative integers", id="uint-negative"),
        pytest.param(body(tensor("I", [1], data=[[{"x": 1}]])), "FP32 data must be numbers",
                     id="nested-object"),
    ],
)  # fmt: skip
def test_what_tritons_reader_would_fail_on_with_a_500_is_refused(raw: bytes, words: str) -> None:
    """Each of these bodies was Triton's 500 (its JSON reader's failures are internal errors
    to it) before the gateway refused them (the fuzz run, tests/integration/
    test_reliability_fuzz.py, found them)."""
    assert words in refused(raw)


def test_values_each_datatype_holds_pass() -> None:
    ok = body(
        tensor("F", [4], data=[1, 2.5, float("nan"), -(2**70)]),
        tensor("B", [2], "BOOL", data=[True, False]),
        tensor("S", [2], "BYTES", data=["a", "\ud83d\ude00"]),
        tensor("U", [1, 2], "UINT64", data=[[0, 2**64 - 1]]),
        tensor("N", [1], "INT8", data=-(2**63)),
        parameters={"sequence_id": "s", "priority": 1, "custom": [1]},
        id="x",
        outputs=[{"name": "O", "parameters": {"binary_data": True, "classification": 2}}],
    )
    assert [t.name for t in parse_infer(ok, None).inputs] == ["F", "B", "S", "U", "N"]
    # an escaped backslash before `ud800` is no surrogate
    assert parse_infer(body(tensor("S", [1], "BYTES", data=["\\ud800"])), None).inputs


def test_generate_bodies_id_and_parameters_as_triton_reads_them() -> None:
    assert json_object(b'{"text_input": "hi", "parameters": {"max_tokens": 2}}', "b")
    for raw, words in [
        (b'{"text_input": "hi", "parameters": "x"}', "parameters must be an object"),
        (b'{"text_input": "hi", "parameters": [[{}]]}', "parameters must be an object"),
        (b'{"text_input": "hi", "parameters": null}', "parameters must be an object"),
        (b'{"text_input": "hi", "id": 5}', "id: must be a string"),
        (b'{"text_input": "\\ud800 hi"}', "lone UTF-16 surrogate"),
        (b'{"text_input": "hi", "parameters": {"sequence_end": 0}}', "sequence_end: must be"),
    ]:
        with pytest.raises(BadRequestError, match=words):
            json_object(raw, "b")


def test_generate_fields_naming_an_input_hold_its_datatype() -> None:
    """`"text_input": true` for a string input was Triton's 500 (the fuzz run found it)."""
    shape = model_shape(
        {"input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
                   {"name": "MAX_TOKENS", "data_type": "TYPE_INT32", "dims": [1]}]}
    )  # fmt: skip
    assert shape is not None
    check_generate_config({"text_input": "hi", "MAX_TOKENS": 3, "other": True}, shape, "m")
    check_generate_config({"text_input": ["a", ["b"]], "parameters": {"x": 1}}, shape, "m")
    for body, words in [
        ({"text_input": True}, "'text_input' (m's input): data holds true; BYTES data must be"),
        ({"text_input": [1]}, "data holds 1; BYTES data must be strings"),
        ({"text_input": None}, "data holds null"),
        ({"MAX_TOKENS": "3"}, 'data holds "3"; INT32 data must be integers'),
        ({"MAX_TOKENS": 1.5}, "INT32 data must be integers"),
    ]:
        with pytest.raises(BadRequestError) as e:
            check_generate_config(body, shape, "m")
        assert words in e.value.message, e.value.message
