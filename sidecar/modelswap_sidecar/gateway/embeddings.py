"""OpenAI embeddings in terms of one Triton inference request (pure).

The contract a model serves `/v1/embeddings` by (Triton configuration, python backend or
any other, not decoupled):

    max_batch_size: 0
    input  text_input     TYPE_STRING  dims [-1]      one UTF-8 string per element
    output embedding      TYPE_FP32    dims [-1, -1]  one row per string (or [-1, width])
    output prompt_tokens  TYPE_INT64   dims [-1]      tokens each string counted (`usage`)

Other inputs must be `optional`. `check_contract` reads a model's configuration and names
everything it lacks.

A request becomes one `POST /v2/models/<triton name>/infer` with the binary tensor
extension both ways (`infer_request`): the strings go as Triton's BYTES serialisation (a
4-byte little-endian length, then the UTF-8 bytes, per string; no JSON escaping to get
wrong), and `embedding` comes back as raw float32 rows, which a `base64` answer carries
as they are and a `float` answer writes as numbers (each the exact value of its float32).
Triton writes binary data in its host's byte order, which on the platforms modelswap
supports (x86_64, aarch64) is little-endian, OpenAI's order for base64.

Refused with 400, naming the field: a body that is not an object, no `model`, `input`
that is empty, holds an empty string or a lone surrogate, holds token ids (a list of ints
or of lists), holds more than `MAX_INPUTS` strings or is not a string or list of strings;
an `encoding_format` other than `float` or `base64`; a `dimensions` that is not a positive
integer, or (`check_dimensions`, once the model answered) is not the model's own width:
rows are never truncated (a model not trained for it gives truncated rows no meaning);
a `user` that is not a string.
"""

from __future__ import annotations

import array
import base64
import json
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from modelswap_sidecar.gateway.errors import (
    BadModelAnswerError,
    BadRequestError,
    NotAnEmbeddingModelError,
)
from modelswap_sidecar.gateway.openai import model_field, request_object

EncodingFormat = Literal["float", "base64"]

#: Strings one request may carry, as OpenAI's own API allows.
MAX_INPUTS = 2048
TEXT_INPUT = "text_input"
EMBEDDING = "embedding"
PROMPT_TOKENS = "prompt_tokens"

_FLOAT32_BYTES = 4
_INT64_BYTES = 8
_LENGTH = struct.Struct("<I")
_OUTPUTS = [
    {"name": EMBEDDING, "parameters": {"binary_data": True}},
    {"name": PROMPT_TOKENS, "parameters": {"binary_data": False}},
]
#: The contract, as `check_contract` names what is missing: (kind, name, type, dims);
#: None in dims: any size (a fixed width is as good as a variable one).
_CONTRACT: tuple[tuple[str, str, str, tuple[int | None, ...]], ...] = (
    ("input", TEXT_INPUT, "TYPE_STRING", (-1,)),
    ("output", EMBEDDING, "TYPE_FP32", (-1, None)),
    ("output", PROMPT_TOKENS, "TYPE_INT64", (-1,)),
)


@dataclass(frozen=True)
class EmbeddingRequest:
    #: as the client named it (`namespace/name` included), echoed in the answer
    model: str
    texts: tuple[str, ...]
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None

    def infer_request(self) -> tuple[bytes, int]:
        """The body of `POST /v2/models/<triton name>/infer` and the length of its JSON
        header (`Inference-Header-Content-Length`); the strings follow it as binary data."""
        encoded = [text.encode() for text in self.texts]
        data = b"".join(_LENGTH.pack(len(raw)) + raw for raw in encoded)
        header = {
            "inputs": [
                {
                    "name": TEXT_INPUT,
                    "shape": [len(encoded)],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": _OUTPUTS,
        }
        header_bytes = json.dumps(header, separators=(",", ":")).encode()
        return header_bytes + data, len(header_bytes)


def parse_embeddings(body: Any) -> EmbeddingRequest:
    """`POST /v1/embeddings`."""
    body = request_object(body)
    model = model_field(body)
    texts = _texts(body.get("input"))
    encoding_format = body.get("encoding_format")
    if encoding_format is None:
        encoding_format = "float"
    if encoding_format not in ("float", "base64"):
        raise BadRequestError("encoding_format: must be 'float' or 'base64'")
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1
    ):
        raise BadRequestError("dimensions: must be a positive integer")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequestError("user: must be a string")
    return EmbeddingRequest(model, texts, encoding_format, dimensions)


def _texts(value: Any) -> tuple[str, ...]:
    if value is None:
        raise BadRequestError("input: a string or a list of strings is required")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise BadRequestError("input: must be a string or a list of strings")
    if not value:
        raise BadRequestError("input: must not be an empty list")
    if len(value) > MAX_INPUTS:
        raise BadRequestError(f"input: at most {MAX_INPUTS} strings per request, not {len(value)}")
    for index, text in enumerate(value):
        if isinstance(text, int | list):
            raise BadRequestError(
                "input: token ids are not supported; send the text (a string or a list of strings)"
            )
        if not isinstance(text, str):
            raise BadRequestError(f"input[{index}]: must be a string")
        if not text:
            raise BadRequestError(f"input[{index}]: must not be an empty string")
        try:
            text.encode()
        except UnicodeEncodeError as e:  # `"\ud800"` is valid JSON, but no UTF-8
            raise BadRequestError(
                f"input[{index}]: holds a lone surrogate at {e.start}, which is not text"
            ) from e
    return tuple(value)


def check_contract(config: Any, model: str) -> None:
    """Raises NotAnEmbeddingModelError naming everything of the contract that the model's
    Triton configuration (`GET /v2/models/<m>/config`) lacks."""
    if not isinstance(config, Mapping):
        raise NotAnEmbeddingModelError(f"{model}: Triton gave no configuration for it")
    problems: list[str] = []
    batch = config.get("max_batch_size", 0)
    if batch != 0:
        problems.append(f"max_batch_size must be 0, not {batch}")
    declared = {
        kind: {str(t.get("name")): t for t in _tensors(config.get(kind)) if t.get("name")}
        for kind in ("input", "output")
    }
    for kind, name, data_type, dims in _CONTRACT:
        tensor = declared[kind].get(name)
        shown = [-1 if d is None else d for d in dims]
        if tensor is None:
            problems.append(f"no {kind} {name} ({data_type}, dims {shown})")
        elif tensor.get("data_type") != data_type or not _dims_match(tensor, dims):
            problems.append(
                f"{kind} {name} is {tensor.get('data_type')} with dims {tensor.get('dims')}, "
                f"not {data_type} with dims {shown}"
            )
    for name, tensor in declared["input"].items():
        if name != TEXT_INPUT and not tensor.get("optional", False):
            problems.append(f"input {name} is required, but the gateway sends only {TEXT_INPUT}")
    if problems:
        raise NotAnEmbeddingModelError(
            f"{model} does not serve embeddings: {'; '.join(problems)} "
            "(see the /v1/embeddings contract in docs/GATEWAY.md)"
        )


def _tensors(value: Any) -> Iterable[Mapping[str, Any]]:
    return [t for t in value if isinstance(t, Mapping)] if isinstance(value, list) else []


def _dims_match(tensor: Mapping[str, Any], wanted: Sequence[int | None]) -> bool:
    dims = tensor.get("dims")
    if not isinstance(dims, list) or len(dims) != len(wanted):
        return False
    try:
        given = [int(d) for d in dims]  # protobuf's JSON may write int64 as strings
    except (TypeError, ValueError):
        return False
    return all(w is None or g == w for g, w in zip(given, wanted, strict=True))


@dataclass(frozen=True)
class Embeddings:
    """The model's answer: `count` rows of `width` float32, little-endian, one after
    another, and the tokens all strings counted."""

    rows: bytes
    count: int
    width: int
    prompt_tokens: int


def _answer_error(message: str) -> BadModelAnswerError:
    return BadModelAnswerError(
        f"the model's answer does not keep the embedding contract: {message}"
    )


def embeddings_of(body: bytes, header_length: int | None, count: int) -> Embeddings:
    """The embeddings in Triton's answer to `infer_request` (its JSON header is the first
    `header_length` bytes when binary data follows); BadModelAnswerError when it is not
    `count` rows and `count` token counts."""
    length = len(body) if header_length is None else header_length
    if not 0 <= length <= len(body):
        raise _answer_error(f"its header length {length} exceeds the body ({len(body)} bytes)")
    try:
        header = json.loads(body[:length])
    except ValueError as e:
        raise _answer_error(f"its header is not JSON: {e}") from e
    outputs = header.get("outputs") if isinstance(header, Mapping) else None
    if not isinstance(outputs, list):
        raise _answer_error("it has no outputs")
    blobs = _blobs(outputs, body, length)
    found = {str(o.get("name")): o for o in outputs if isinstance(o, Mapping)}
    embedding = found.get(EMBEDDING)
    tokens = found.get(PROMPT_TOKENS)
    if embedding is None or tokens is None:
        raise _answer_error(f"it lacks {EMBEDDING} or {PROMPT_TOKENS}")
    shape = embedding.get("shape")
    if (
        embedding.get("datatype") != "FP32"
        or not isinstance(shape, list)
        or len(shape) != 2
        or shape[0] != count
        or not isinstance(shape[1], int)
        or shape[1] < 1
    ):
        raise _answer_error(
            f"{EMBEDDING} is {embedding.get('datatype')} of shape {shape}, not FP32 of "
            f"shape [{count}, width]"
        )
    width = shape[1]
    rows = _values(embedding, blobs.get(EMBEDDING), "f", _FLOAT32_BYTES, count * width)
    rows_bytes = rows.tobytes()
    if tokens.get("shape") != [count] or tokens.get("datatype") != "INT64":
        raise _answer_error(
            f"{PROMPT_TOKENS} is {tokens.get('datatype')} of shape {tokens.get('shape')}, "
            f"not INT64 of shape [{count}]"
        )
    counted = _values(tokens, blobs.get(PROMPT_TOKENS), "q", _INT64_BYTES, count)
    if any(n < 0 for n in counted):
        raise _answer_error(f"{PROMPT_TOKENS} holds a negative count")
    return Embeddings(rows_bytes, count, width, sum(counted))


def _blobs(outputs: Sequence[Any], body: bytes, offset: int) -> dict[str, bytes]:
    """Each binary output's bytes: they follow the header in the order of `outputs`."""
    blobs: dict[str, bytes] = {}
    for output in outputs:
        parameters = output.get("parameters") if isinstance(output, Mapping) else None
        size = parameters.get("binary_data_size") if isinstance(parameters, Mapping) else None
        if size is None:
            continue
        if not isinstance(size, int) or size < 0 or offset + size > len(body):
            raise _answer_error(f"output {output.get('name')} has a bad binary_data_size {size}")
        blobs[str(output.get("name"))] = body[offset : offset + size]
        offset += size
    return blobs


def _values(
    output: Mapping[str, Any], blob: bytes | None, code: str, item_bytes: int, count: int
) -> array.array[Any]:
    """An output's `count` values, from its binary data or else its JSON `data`."""
    name = output.get("name")
    if blob is None:
        data = output.get("data")
        if not isinstance(data, list) or len(data) != count:
            raise _answer_error(f"{name} carries no data for {count} values")
        try:
            return array.array(code, data)
        except (TypeError, OverflowError) as e:
            raise _answer_error(f"{name} holds a value that is not a number: {e}") from e
    if len(blob) != count * item_bytes:
        raise _answer_error(f"{name} has {len(blob)} bytes of data, not {count * item_bytes}")
    return array.array(code, blob)


def check_dimensions(request: EmbeddingRequest, width: int) -> None:
    if request.dimensions is not None and request.dimensions != width:
        raise BadRequestError(
            f"dimensions: {request.model} answers {width} dimensions; ask for {width} or "
            "leave dimensions out (rows are not truncated)"
        )


_COMPACT = json.JSONEncoder(separators=(",", ":"))
#: Numbers written into an answer before its writer may give the event loop a turn: about
#: 6 ms of formatting as `float` on a 2-core build machine, where 2,048 rows of 384 take
#: 1.1 s in all (base64: 0.02 s), which must not hold every other request back.
VALUES_PER_PIECE = 4096


def response_pieces(
    request: EmbeddingRequest, embeddings: Embeddings, values_per_piece: int = VALUES_PER_PIECE
) -> Iterator[bytes]:
    """OpenAI's answer, JSON, in pieces of about `values_per_piece` numbers each (the
    caller gives the event loop a turn between them): one `embedding` object per string,
    in order, as numbers (each the exact value of its float32) or as base64 of
    little-endian float32."""
    yield b'{"object":"list","data":['
    width = embeddings.width
    rows = embeddings.rows
    as_base64 = request.encoding_format == "base64"
    numbers = array.array("f", b"" if as_base64 else rows)
    piece: list[bytes] = []
    in_piece = 0
    for index in range(embeddings.count):
        if as_base64:
            row = rows[index * width * _FLOAT32_BYTES : (index + 1) * width * _FLOAT32_BYTES]
            embedding = b'"' + base64.b64encode(row) + b'"'
        else:
            row_numbers = numbers[index * width : (index + 1) * width].tolist()
            embedding = _COMPACT.encode(row_numbers).encode()
        comma = b"," if index else b""
        piece.append(
            b'%s{"object":"embedding","index":%d,"embedding":%s}' % (comma, index, embedding)
        )
        in_piece += width
        if in_piece >= values_per_piece:
            yield b"".join(piece)
            piece, in_piece = [], 0
    tokens = embeddings.prompt_tokens
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    piece.append(
        f'],"model":{_COMPACT.encode(request.model)},"usage":{_COMPACT.encode(usage)}}}'.encode()
    )
    yield b"".join(piece)


def response_body(request: EmbeddingRequest, embeddings: Embeddings) -> bytes:
    """`response_pieces` joined."""
    return b"".join(response_pieces(request, embeddings))


class CheckedModels:
    """Triton names whose configuration kept the contract, so a request does not ask for
    it again. Bounded: past `limit` names the oldest is forgotten."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._names: dict[str, None] = {}

    def __contains__(self, triton_name: object) -> bool:
        return triton_name in self._names

    def add(self, triton_name: str) -> None:
        self._names[triton_name] = None
        while len(self._names) > self._limit:
            del self._names[next(iter(self._names))]

    def forget(self, triton_name: str) -> None:
        self._names.pop(triton_name, None)
