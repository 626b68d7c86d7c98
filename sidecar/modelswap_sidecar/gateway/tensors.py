"""What a KServe v2 inference request may make Triton allocate, bounded before it is
forwarded (pure).

Triton's HTTP frontend sizes an input's buffer from its `shape` before it reads the data:
`{"shape": [1000000, 1000000], "datatype": "FP32", "data": [1]}` (a 67-byte input) had it
allocate 4 TB and abort (`std::bad_alloc`), every model going down with it. So the gateway
parses the request's JSON header and refuses with 400, naming the input:

- a body that is not a JSON object (not UTF-8, UTF-16, malformed), `inputs` that is not a
  list of objects, an input without a string `name`, a `shape` that is not a list of
  non-negative integers, a `datatype` that is not one of v2's;
- an input whose data is not all there: JSON `data` whose values (nested lists
  flattened) are not exactly shape's product; binary data (`binary_data_size`) that is
  not shape's product times the element size (BYTES: less than 4 bytes, the length
  prefix, per element); binary sizes that do not add up to what follows the header;
  an input with neither;
- `shared_memory_region` on an input or an output: Triton's shared-memory registration
  is not exposed through the gateway, so a region a request names is one the node
  registered for itself, which no client may read or write;
- `Inference-Header-Content-Length` that is not a decimal number (ASCII digits) no larger
  than the body;
- what Triton's JSON reader fails on with its own 500 (it takes them for its errors, not
  the client's): a string holding a lone UTF-16 surrogate (`"\\ud800"`, valid JSON text
  that names no character); an `id` that is not a string; `parameters` (the request's, an
  input's, an output's) that is not an object, or whose parameter Triton reads itself is
  of another type (`sequence_id` a string or unsigned 64-bit integer, `priority` and
  `timeout` unsigned 64-bit integers, `sequence_start`, `sequence_end`,
  `binary_data_output` and an output's `binary_data` booleans, an output's
  `classification` an unsigned 64-bit integer); JSON `data` holding a value its datatype
  cannot hold (BYTES: strings; BOOL: booleans; integer types: integers within 64 bits,
  unsigned ones not negative; floating-point types: numbers).

Every input's bytes are therefore in the body the client sent (at most
`max_body_bytes`): JSON data costs Triton at most 8 bytes per value, and a value takes at
least two bytes of the body. `check_config` adds the model's own bounds from its Triton
configuration (`ModelShape`): the input is one the model declares, of its datatype, of
its rank, each dimension equal to a fixed `dims` entry, and the batch dimension (when
`max_batch_size` > 0) at most `max_batch_size`.

    request = parse_infer(body, header_length_text)     # BadRequestError
    check_config(request, model_shape(config), "plain")  # BadRequestError
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelswap_sidecar.gateway.errors import BadRequestError

#: Bytes per element of each v2 datatype; BYTES has none (a 4-byte length, then the bytes).
ELEMENT_BYTES: Mapping[str, int] = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "FP32": 4,
    "FP64": 8,
    "BF16": 2,
}
BYTES = "BYTES"
#: A BYTES element in binary data: at least its 4-byte length.
_BYTES_ELEMENT_MIN_BYTES = 4
SHARED_MEMORY_PARAMETER = "shared_memory_region"
#: Names and datatypes shown in messages are cut to this many characters.
_SHOWN = 64
_UINT64_MAX = (1 << 64) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
#: A `\\u` escape of a UTF-16 surrogate in JSON text (a pair is one character; a lone one is
#: none, and Triton's reader fails on it with a 500).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _is_uint64(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _UINT64_MAX


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _is_sequence_id(value: object) -> bool:
    return isinstance(value, str) or _is_uint64(value)


#: Parameters Triton reads itself, with what each must be (any other is passed on to the
#: model, and Triton refuses a type it cannot pass with its own 400).
_REQUEST_PARAMETERS = {
    "sequence_id": (_is_sequence_id, "a string or an unsigned 64-bit integer"),
    "sequence_start": (_is_bool, "true or false"),
    "sequence_end": (_is_bool, "true or false"),
    "binary_data_output": (_is_bool, "true or false"),
    "priority": (_is_uint64, "an unsigned 64-bit integer"),
    "timeout": (_is_uint64, "an unsigned 64-bit integer"),
}
_OUTPUT_PARAMETERS = {
    "binary_data": (_is_bool, "true or false"),
    "classification": (_is_uint64, "an unsigned 64-bit integer"),
}


def _holds_string(value: object) -> bool:
    return isinstance(value, str)


def _holds_signed(value: object) -> bool:
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


def _holds_unsigned(value: object) -> bool:
    return type(value) is int and 0 <= value <= _UINT64_MAX


def _holds_number(value: object) -> bool:
    return type(value) is float or type(value) is int


#: What a JSON `data` value of each datatype must be (what Triton's reader takes for it),
#: and how a message says so.
_DATA_VALUES = {
    BYTES: (_holds_string, "strings"),
    "BOOL": (_is_bool, "true or false"),
    **{t: (_holds_signed, "integers within 64 bits") for t in ("INT8", "INT16", "INT32", "INT64")},
    **{
        t: (_holds_unsigned, "non-negative integers within 64 bits")
        for t in ("UINT8", "UINT16", "UINT32", "UINT64")
    },
    **{t: (_holds_number, "numbers") for t in ("FP16", "FP32", "FP64", "BF16")},
}


@dataclass(frozen=True)
class TensorInput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    #: bytes of binary data after the header, or None for JSON `data`
    binary_bytes: int | None

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class InferRequest:
    inputs: tuple[TensorInput, ...]


@dataclass(frozen=True)
class DeclaredInput:
    name: str
    datatype: str  # v2's name: FP32, BYTES
    dims: tuple[int, ...]  # -1: any size


@dataclass(frozen=True)
class ModelShape:
    """The bounds a model's Triton configuration puts on its inputs."""

    max_batch_size: int
    inputs: Mapping[str, DeclaredInput]


def _shown(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return repr(text[:_SHOWN] + ("…" if len(text) > _SHOWN else ""))


def header_length(text: str | None, body_bytes: int) -> int | None:
    """`Inference-Header-Content-Length` as a number, None when the header is absent;
    BadRequestError when it is not ASCII digits or exceeds the body (`²` is a digit to
    Python's `isdigit`, and no number to `int`)."""
    if text is None:
        return None
    value = text.strip()
    if not (value.isascii() and value.isdigit()):
        raise BadRequestError(
            f"Inference-Header-Content-Length {_shown(text)} is not a decimal number of bytes"
        )
    length = int(value)
    if length > body_bytes:
        raise BadRequestError(
            f"Inference-Header-Content-Length {length} exceeds the body ({body_bytes} bytes)"
        )
    return length


def json_object(raw: bytes, what: str) -> dict[str, Any]:
    """`raw` as the JSON object of a v2 request (`infer`'s header, a `generate` body);
    BadRequestError saying why it is not one (not UTF-8, say UTF-16; not JSON; another
    JSON value; a lone surrogate), or why Triton's reader would fail on its `id` or its
    `parameters`. NaN and Infinity pass, as Triton takes them."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequestError(
            f"{what} is not UTF-8 (byte {e.start} is not valid UTF-8; UTF-16 is not taken)"
        ) from e
    try:
        value = json.loads(text)
    except RecursionError as e:
        raise BadRequestError(f"{what} is nested too deep") from e
    except ValueError as e:
        raise BadRequestError(f"{what} is not JSON: {str(e)[:200]}") from e
    if not isinstance(value, dict):
        raise BadRequestError(f"{what} must be a JSON object, not {type(value).__name__}")
    if _SURROGATE_ESCAPE.search(text) is not None:
        try:  # a pair was read as one character; a lone surrogate cannot be encoded
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise BadRequestError(
                f"{what} holds a string with a lone UTF-16 surrogate "
                f"({e.object[e.start : e.end].encode('unicode_escape').decode()}), which "
                "is no character"
            ) from e
    if "id" in value and not isinstance(value["id"], str):
        raise BadRequestError("id: must be a string")
    if "parameters" in value:
        _check_parameters(value["parameters"], "parameters", _REQUEST_PARAMETERS)
    return value


def _check_parameters(parameters: object, where: str, known: Mapping[str, tuple[Any, str]]) -> None:
    """Given (`null` included: Triton refuses it with a 500), an object whose parameters
    Triton reads itself are of their types."""
    if not isinstance(parameters, dict):
        raise BadRequestError(f"{where} must be an object")
    for name, (holds, wanted) in known.items():
        if name in parameters and not holds(parameters[name]):
            raise BadRequestError(f"{where}.{name}: must be {wanted}")


def parse_infer(body: bytes, length_text: str | None) -> InferRequest:
    """The inputs of a `POST .../infer` body (JSON header, then any binary tensor data),
    each checked against the bytes the body carries for it."""
    length = header_length(length_text, len(body))
    header = json_object(body if length is None else body[:length], "the request's JSON")
    binary_bytes = 0 if length is None else len(body) - length
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list):
        raise BadRequestError("inputs: must be a list of input tensors")
    inputs = tuple(_input(raw, index) for index, raw in enumerate(raw_inputs))
    check_names(inputs)
    declared_binary = sum(t.binary_bytes or 0 for t in inputs)
    if declared_binary != binary_bytes:
        raise BadRequestError(
            f"the inputs' binary_data_size add up to {declared_binary} bytes, but "
            f"{binary_bytes} bytes follow the JSON header"
        )
    _refuse_shared_memory_outputs(header.get("outputs"))
    return InferRequest(inputs)


def _input(raw: object, index: int) -> TensorInput:
    """One input of an HTTP request's JSON header: what it carries fed to `tensor_input`."""
    if not isinstance(raw, dict):
        raise BadRequestError(f"inputs[{index}]: must be an object")
    name = raw.get("name")
    if not isinstance(name, str):
        raise BadRequestError(f"inputs[{index}]: name must be a string")
    where = f"input {_shown(name)}"
    parameters = raw.get("parameters", {})
    if not isinstance(parameters, dict):
        raise BadRequestError(f"{where}: parameters must be an object")
    size = parameters.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadRequestError(f"{where}: binary_data_size must be a non-negative integer")
        carried = Carried(data_bytes=size, name=f"binary_data_size is {size}")
    elif "data" in raw:
        datatype = raw.get("datatype")
        values = (
            _count_values(raw["data"], datatype, where)
            if isinstance(datatype, str) and datatype in _DATA_VALUES
            else None  # `tensor_input` refuses the datatype
        )
        carried = Carried(values=values, name="data")
    else:
        carried = Carried(name="data nor binary_data_size")
    return tensor_input(name, raw.get("datatype"), raw.get("shape"), parameters, carried)


@dataclass(frozen=True)
class Carried:
    """What a request carries for one input's data: bytes (HTTP's binary data, gRPC's
    `raw_input_contents`), or values (HTTP's JSON `data`, gRPC's typed `contents`, the
    strings of BYTES raw contents), or neither (both None); `name` says which in messages."""

    data_bytes: int | None = None
    values: int | None = None
    name: str = "data"


def tensor_input(
    name: str, datatype: object, shape: object, parameters: Mapping[str, object], carried: Carried
) -> TensorInput:
    """One input checked against what the request carries for it, whichever front it came
    through (HTTP JSON or binary, gRPC raw or typed contents): a v2 datatype, a shape of
    non-negative integers, no shared memory, and exactly the data its shape needs.
    BadRequestError naming the input."""
    where = f"input {_shown(name)}"
    if not isinstance(datatype, str) or (datatype != BYTES and datatype not in ELEMENT_BYTES):
        raise BadRequestError(f"{where}: datatype {_shown(datatype)} is not a v2 datatype")
    dims = _shape(shape, where)
    if SHARED_MEMORY_PARAMETER in parameters:
        raise _shared_memory_error(where)
    elements = math.prod(dims)
    shown_shape = list(dims)
    size = carried.data_bytes
    if size is not None:
        if datatype == BYTES:
            if elements * _BYTES_ELEMENT_MIN_BYTES > size:
                raise BadRequestError(
                    f"{where}: shape {shown_shape} holds {elements} strings, but its "
                    f"{size} bytes of binary data cannot (each takes at least 4 bytes)"
                )
        elif (needed := elements * ELEMENT_BYTES[datatype]) != size:
            raise BadRequestError(
                f"{where}: shape {shown_shape} of {datatype} is {needed} bytes, but {carried.name}"
            )
        return TensorInput(name, datatype, dims, size)
    if carried.values is None:
        raise BadRequestError(f"{where}: carries neither {carried.name}")
    if carried.values != elements:
        raise BadRequestError(
            f"{where}: shape {shown_shape} holds {elements} elements, but {carried.name} "
            f"has {carried.values}"
        )
    return TensorInput(name, datatype, dims, None)


def prefixed_strings(data: bytes, where: str) -> int:
    """The strings of BYTES tensor data (each a 4-byte little-endian length, then that many
    bytes); BadRequestError when a length runs past the data."""
    count = offset = 0
    while offset < len(data):
        if offset + _BYTES_ELEMENT_MIN_BYTES > len(data):
            raise BadRequestError(
                f"{where}: its BYTES data ends inside a 4-byte length prefix (at byte {offset} "
                f"of {len(data)})"
            )
        length = int.from_bytes(data[offset : offset + _BYTES_ELEMENT_MIN_BYTES], "little")
        offset += _BYTES_ELEMENT_MIN_BYTES + length
        if offset > len(data):
            raise BadRequestError(
                f"{where}: string {count}'s length prefix says {length} bytes, past the end of "
                f"its {len(data)} bytes of BYTES data"
            )
        count += 1
    return count


def check_request_parameters(parameters: Mapping[str, object]) -> None:
    """The request's parameters that Triton reads itself are of their types."""
    _check_parameters(parameters, "parameters", _REQUEST_PARAMETERS)


def check_output(name: str, parameters: Mapping[str, object]) -> None:
    """A requested output's parameters that Triton reads itself are of their types, and it
    names no shared memory."""
    where = f"output {_shown(name)}"
    _check_parameters(parameters, f"{where}: parameters", _OUTPUT_PARAMETERS)
    if SHARED_MEMORY_PARAMETER in parameters:
        raise _shared_memory_error(where)


def check_names(inputs: Sequence[TensorInput]) -> None:
    """No input is given twice."""
    seen: set[str] = set()
    for tensor in inputs:
        if tensor.name in seen:
            raise BadRequestError(f"input {_shown(tensor.name)} is given more than once")
        seen.add(tensor.name)


def _shape(raw: object, where: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw
    ):
        raise BadRequestError(f"{where}: shape must be a list of non-negative integers")
    return tuple(raw)


def _count_values(data: object, datatype: str, where: str) -> int:
    """Values in `data`, nested lists flattened (v2 takes both forms); BadRequestError for
    a value `datatype` cannot hold."""
    holds, wanted = _DATA_VALUES[datatype]
    count = 0
    stack: list[list[Any]] = [data if isinstance(data, list) else [data]]
    while stack:
        for item in stack.pop():
            if type(item) is list:
                stack.append(item)
            elif holds(item):
                count += 1
            else:
                shown = json.dumps(item, default=str)  # as JSON: 5 and "5" differ here
                shown = shown[:_SHOWN] + ("…" if len(shown) > _SHOWN else "")
                raise BadRequestError(
                    f"{where}: data holds {shown}; {datatype} data must be {wanted}"
                )
    return count


def _shared_memory_error(where: str) -> BadRequestError:
    return BadRequestError(
        f"{where}: shared memory (shared_memory_region) is not served through the gateway; "
        "send the data in the body"
    )


def _refuse_shared_memory_outputs(outputs: object) -> None:
    if outputs is None:
        return
    if not isinstance(outputs, list):
        raise BadRequestError("outputs: must be a list of requested outputs")
    for index, output in enumerate(outputs):
        if not isinstance(output, dict):
            raise BadRequestError(f"outputs[{index}]: must be an object")
        name = output.get("name")
        if not isinstance(name, str):
            raise BadRequestError(f"outputs[{index}]: name must be a string")
        parameters = output.get("parameters", {})
        if not isinstance(parameters, dict):
            raise BadRequestError(f"output {_shown(name)}: parameters must be an object")
        check_output(name, parameters)


def model_shape(config: object) -> ModelShape | None:
    """The input bounds of a model's Triton configuration (`GET .../config`), or None when
    it is not one the gateway can read (then only the body's bounds apply)."""
    if not isinstance(config, Mapping) or not isinstance(config.get("input"), list):
        return None
    try:
        max_batch_size = int(config.get("max_batch_size", 0))
        inputs: dict[str, DeclaredInput] = {}
        for tensor in config.get("input", []):
            name = str(tensor["name"])
            data_type = str(tensor.get("data_type", ""))
            datatype = "BYTES" if data_type == "TYPE_STRING" else data_type.removeprefix("TYPE_")
            # protobuf's JSON may write int64 as strings
            dims = tuple(int(d) for d in tensor.get("dims", []))
            inputs[name] = DeclaredInput(name, datatype, dims)
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    return ModelShape(max_batch_size, inputs)


def check_config(request: InferRequest, shape: ModelShape, model: str) -> None:
    """BadRequestError naming the first input that the model's configuration does not
    allow: unknown, of another datatype or rank, a dimension other than a fixed one, or a
    batch larger than `max_batch_size`."""
    for tensor in request.inputs:
        where = f"input {_shown(tensor.name)}"
        declared = shape.inputs.get(tensor.name)
        if declared is None:
            known = ", ".join(sorted(shape.inputs)) or "none"
            raise BadRequestError(f"{where}: {model} has no such input (it has {known})")
        if tensor.datatype != declared.datatype:
            raise BadRequestError(
                f"{where}: {model} takes {declared.datatype}, not {tensor.datatype}"
            )
        _check_dims(tensor, declared, shape.max_batch_size, model, where)


def _check_dims(
    tensor: TensorInput, declared: DeclaredInput, max_batch_size: int, model: str, where: str
) -> None:
    allowed: Sequence[int] = declared.dims
    given: Sequence[int] = tensor.shape
    wanted = list(declared.dims)
    if max_batch_size > 0:
        wanted = [-1, *wanted]
        if not given or given[0] > max_batch_size:
            raise BadRequestError(
                f"{where}: shape {list(given)} has a batch of {given[0] if given else 'none'}; "
                f"{model} takes at most {max_batch_size} (shape [batch, *{list(allowed)}])"
            )
        given = given[1:]
    if len(given) != len(allowed) or any(
        d not in (-1, g) for g, d in zip(given, allowed, strict=True)
    ):
        raise BadRequestError(
            f"{where}: shape {list(tensor.shape)} does not fit {model}'s dims {wanted}"
        )


def check_generate_config(body: Mapping[str, Any], shape: ModelShape, model: str) -> None:
    """A `generate`/`generate_stream` body against the model's configuration: Triton makes
    one input tensor per field that names an input, and a value its datatype cannot hold
    (`"text_input": true` for a STRING input) was its 500. BadRequestError naming the
    field."""
    for name, declared in shape.inputs.items():
        if name in body and declared.datatype in _DATA_VALUES:
            _count_values(body[name], declared.datatype, f"{_shown(name)} ({model}'s input)")
