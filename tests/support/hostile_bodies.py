"""A seeded generator of hostile requests for the gateway: KServe v2 `infer` bodies (JSON
and binary tensors), `generate`/`generate_stream` bodies, OpenAI completions, chat and
embeddings bodies, odd encodings and headers, and raw HTTP/1.1 that no client library
would send (truncated bodies, lying lengths, bad chunks, bytes outside Latin-1).

Each input starts from a request the target model would serve and is broken in one to
three places (`random.Random(seed)`: the same seed gives the same inputs), so most inputs
get past the first check and meet the later ones. The targets are the toy models of
`tests/data/gateway_models`: `batched` (v2, max_batch_size 4, INPUT0 FP32 [2, 3], LABEL
strings), `tokens` (decoupled text: one response per word of the prompt, at most
`max_tokens`) and `hashembed` (the embedding contract). The string `raise` asks those toys
to fail on purpose, so it is never generated: a model's own error is not the gateway's.

Prompts stay short in words (a long prompt is one long word): `tokens` streams one
response per word, and the bounds on generation are another test's business.
"""

from __future__ import annotations

import base64
import gzip
import json
import random
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

#: Every datatype of the v2 protocol, and some that are not.
V2_TYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
            "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16")  # fmt: skip
BAD_TYPES: tuple[Any, ...] = ("fp32", "", "FLOAT", "STRING", 5, None, ["FP32"], "FP32\u0000")
#: Strings that mean something to someone: escapes, controls, surrogates, huge numbers.
ODD_STRINGS = (
    "", " ", "\u0000", "\u001b[2J\u001b]0;title\u0007", "\u202eevil", "\ud800", "\udfff",
    "é", "\u2603", "\U0001f600", "../../etc/passwd", "%00", "%2e%2e/", "\\u0000", "null",
    "NaN", "-1", "1e309", "0x10", "${jndi:ldap://x}", "<script>", "'; DROP TABLE m;--",
    "a" * 300, "\r\nX-Injected: 1", "\t", "²", "٣",
)  # fmt: skip
ODD_NUMBERS: tuple[Any, ...] = (
    0, -1, 1, 2**31, 2**32, 2**53 + 1, 2**63, 2**64, 2**70, -(2**63), 1.5, -0.0, 1e308,
    True, False, None, "10", "", [], {}, [1],
)  # fmt: skip
FAILING_TEXT = "raise"


@dataclass(frozen=True)
class HostileInput:
    """One request: `kind` names the family it came from (for the counts)."""

    kind: str
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    #: When set, these exact bytes go over a raw socket (the other fields describe them).
    raw: bytes | None = None
    #: The sender half-closes after `raw`: a server waiting for more (a body shorter than
    #: its length) then sees its end instead of waiting for its read timeout.
    half_close: bool = False


def _not_failing(text: str) -> str:
    return "rais" if text == FAILING_TEXT else text


def odd_string(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(1, 12)))
    return rng.choice(ODD_STRINGS)


def deep(rng: random.Random, leaf: Any = 1) -> Any:
    """A list nested 20 to 400 levels (the gateway's JSON depth bound is 32 for v2 and 64
    for OpenAI; Python's json recursion ends near 1,000)."""
    value = leaf
    for _ in range(rng.choice((20, 33, 65, 200, 400))):
        value = [value]
    return value


def dumps(value: Any, rng: random.Random) -> bytes:
    """JSON text, sometimes with every non-ASCII character escaped (lone surrogates then
    become legal JSON text that names no character)."""
    ascii_only = rng.random() < 0.5
    try:
        return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True).encode(
            "utf-8", "surrogatepass"
        )
    except RecursionError:
        return b"[" * 5000 + b"]" * 5000


# -- v2 infer (batched) ------------------------------------------------------------------------


def _legal_infer(rng: random.Random) -> dict[str, Any]:
    batch = rng.randrange(1, 5)
    body: dict[str, Any] = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [batch, 2, 3],
                "datatype": "FP32",
                "data": [rng.uniform(-10, 10) for _ in range(batch * 6)],
            }
        ]
    }
    if rng.random() < 0.5:
        labels = [_not_failing(odd_string(rng)) for _ in range(batch * 2)]
        body["inputs"].append(
            {"name": "LABEL", "shape": [batch, 2], "datatype": "BYTES", "data": labels}
        )
    return body


def _break_shape(rng: random.Random, tensor: dict[str, Any]) -> None:
    tensor["shape"] = rng.choice([
        [1000000, 1000000], [2**62, 2], [2**63], [2**64, 1], [-1, 2, 3], [1, -2, 3], [0, 2, 3],
        [1, 2, 3.0], [1, "2", 3], [True, 2, 3], [], [1] * 50, None, "1,2,3", {"0": 1},
        [5, 2, 3], [4, 3, 2], [4, 2, 3, 1], [1e30], [2**31, 2**31],
    ])  # fmt: skip


def _break_data(rng: random.Random, tensor: dict[str, Any]) -> None:
    data = tensor.get("data")
    size = len(data) if isinstance(data, list) else 6
    tensor["data"] = rng.choice([
        [1], [], [1.0] * (size + 1), [[1, 2], [3]], ["a"] * size, [True] * size, [None] * size,
        [{"x": 1}] * size, [1e308] * size, [-(2**70)] * size, deep(rng), "1,2,3", None, 1,
        {"b64": "AAAA"}, [[v] for v in (data or [0])],
    ])  # fmt: skip


def _break_tensor(rng: random.Random, tensor: dict[str, Any]) -> None:
    choice = rng.randrange(8)
    if choice == 0:
        _break_shape(rng, tensor)
    elif choice == 1:
        _break_data(rng, tensor)
    elif choice == 2:
        tensor["datatype"] = rng.choice((*V2_TYPES, *BAD_TYPES))
    elif choice == 3:
        tensor["name"] = rng.choice(["INPUT1", "", 5, None, "input0", odd_string(rng)])
    elif choice == 4:
        tensor["parameters"] = rng.choice([
            {"binary_data_size": rng.choice(ODD_NUMBERS)},
            {"shared_memory_region": "r", "shared_memory_byte_size": 24},
            {"shared_memory_region": odd_string(rng), "shared_memory_offset": 2**63},
            {"binary_data": True}, [], "x", {"classification": 2**40},
        ])  # fmt: skip
    elif choice == 5:
        del tensor[rng.choice(sorted(tensor))]
    elif choice == 6:
        tensor[odd_string(rng) or "k"] = rng.choice(ODD_NUMBERS)
    else:
        tensor["datatype"] = "BYTES"
        tensor["data"] = [_not_failing(odd_string(rng)) for _ in range(6)]


def _break_infer(rng: random.Random, body: dict[str, Any]) -> None:
    choice = rng.randrange(10)
    inputs = body["inputs"]
    if choice <= 4:
        _break_tensor(rng, rng.choice(inputs))
    elif choice == 5:
        inputs.append(json.loads(json.dumps(inputs[0])))  # the same input twice
    elif choice == 6:
        body["outputs"] = rng.choice([
            [{"name": "NOPE"}], [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
            [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "r",
                                                "shared_memory_byte_size": 24}}],
            [{"name": "OUTPUT0", "parameters": {"classification": 2**40}}], "OUTPUT0", [5],
        ])  # fmt: skip
    elif choice == 7:
        body[rng.choice(["inputs", "id", "parameters", odd_string(rng) or "x"])] = rng.choice(
            ODD_NUMBERS
        )
    elif choice == 8:
        body["parameters"] = rng.choice([
            {"sequence_id": 2**70}, {"priority": -1}, {"timeout": 2**64}, {"binary_data_output": 1},
            {"sequence_start": "yes"}, deep(rng, {}),
        ])  # fmt: skip
    else:
        body["inputs"] = rng.choice([[], {}, None, [1], [[]], deep(rng, {})])


def v2_infer_json(rng: random.Random) -> HostileInput:
    body = _legal_infer(rng)
    for _ in range(rng.randrange(1, 4)):
        try:
            _break_infer(rng, body)
        except (KeyError, IndexError, TypeError, AttributeError):
            break  # an earlier break took away what this one would change
    text = dumps(body, rng)
    if rng.random() < 0.1:
        text = text[: rng.randrange(1, max(len(text), 2))]  # truncated JSON
    headers = {"Content-Type": rng.choice(["application/json", "text/plain", "", "x/y"])}
    return HostileInput("v2 infer, JSON", "POST", _v2_path(rng, "batched", "infer"), headers, text)


def _v2_path(rng: random.Random, model: str, verb: str) -> str:
    roll = rng.random()
    if roll < 0.85:
        return f"/v2/models/{model}/{verb}"
    if roll < 0.9:
        return (
            f"/v2/models/{model}/versions/{rng.choice(['1', '0', '-1', '99999999999', 'x'])}/{verb}"
        )
    if roll < 0.95:
        return f"/ns/{rng.choice(['default', 'nope', '..', '%00'])}/v2/models/{model}/{verb}"
    return f"/v2/models/{rng.choice(['nope', 'BATCHED', 'batched%2F..', '%ff', 'a' * 300])}/{verb}"


# -- v2 infer with binary tensors -------------------------------------------------------------


def _bytes_tensor(strings: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(s)) + s for s in strings)


def v2_infer_binary(rng: random.Random) -> HostileInput:
    batch = rng.randrange(1, 5)
    floats = struct.pack(f"<{batch * 6}f", *(rng.uniform(-9, 9) for _ in range(batch * 6)))
    labels = [_not_failing(odd_string(rng)).encode("utf-8", "surrogatepass") for _ in range(batch)]
    strings = _bytes_tensor(labels)
    inputs: list[dict[str, Any]] = [
        {"name": "INPUT0", "shape": [batch, 2, 3], "datatype": "FP32",
         "parameters": {"binary_data_size": len(floats)}},
        {"name": "LABEL", "shape": [batch, 1], "datatype": "BYTES",
         "parameters": {"binary_data_size": len(strings)}},
    ]  # fmt: skip
    tail = floats + strings
    choice = rng.randrange(11)  # 10: nothing broken (binary odd labels only)
    if choice == 0:
        inputs[0]["parameters"]["binary_data_size"] = rng.choice(ODD_NUMBERS)
    elif choice == 1:
        inputs[0]["shape"] = rng.choice([[1000000, 1000000], [2**40, 2, 3], [-1, 2, 3], [0, 2, 3]])
    elif choice == 2:  # a BYTES element whose length prefix lies
        lie = struct.pack("<I", rng.choice([2**31, 2**32 - 1, 1000, 0]))
        strings = lie + strings[4:]
        tail = floats + strings
    elif choice == 3:
        tail = tail[: rng.randrange(0, len(tail))]  # truncated tensors
    elif choice == 4:
        tail += b"\0" * rng.randrange(1, 64)  # bytes no input claims
    elif choice == 5:
        inputs[1]["datatype"] = rng.choice(["FP32", "INT8", "BOOL"])
    elif choice == 6:
        inputs[1]["parameters"]["binary_data_size"] = 3  # less than one length prefix
    elif choice == 7:
        inputs[0]["data"] = [1.0] * (batch * 6)  # both data and binary
    header = dumps({"inputs": inputs}, rng)
    length: str = str(len(header))
    if choice == 8:
        length = rng.choice(["²", "-5", " 12", "0x10", "", "1" * 30, str(len(header) + 10**6),
                             str(len(header) - 3), "12abc", "٣"])  # fmt: skip
    elif choice == 9:
        header = header[: len(header) // 2]  # the header's JSON cut short
        length = str(len(header))
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": length,
    }
    return HostileInput(
        "v2 infer, binary tensors", "POST", _v2_path(rng, "batched", "infer"), headers,
        header + tail,
    )  # fmt: skip


# -- v2 generate ------------------------------------------------------------------------------


def _prompt(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.01:  # long, but one word (within the OpenAI body limit of 8 MiB)
        return "x" * rng.choice([1 << 20, 7 << 20])
    if roll < 0.1:
        return odd_string(rng) * rng.randrange(1, 4)
    words = ["hello", "world", "é", "\u2603", "swap", "in"]
    return " ".join(rng.choice(words) for _ in range(rng.randrange(0, 20)))


def v2_generate(rng: random.Random) -> HostileInput:
    body: Any = {"text_input": _prompt(rng), "parameters": {"max_tokens": rng.randrange(1, 8)}}
    choice = rng.randrange(8)
    if choice == 0:
        body["parameters"]["max_tokens"] = rng.choice(ODD_NUMBERS)
    elif choice == 1:
        body["text_input"] = rng.choice([5, None, [], ["a", "b"], {"x": 1}, deep(rng, "a"), True])
    elif choice == 2:
        body = rng.choice([[], "text", 5, None, deep(rng, {})])
    elif choice == 3:
        body["parameters"] = rng.choice([[], "x", None, {"stream": "yes"}, deep(rng, {})])
    elif choice == 4:
        body[rng.choice(["unknown_input", "id", "INPUT0"])] = rng.choice(ODD_NUMBERS)
    elif choice == 5:
        del body["text_input"]
    verb = rng.choice(["generate", "generate_stream", "generate_stream"])
    model = rng.choice(["tokens", "tokens", "tokens", "batched", "hashembed"])
    headers = {"Content-Type": "application/json"}
    if verb == "generate_stream" and rng.random() < 0.5:
        headers["Accept"] = "text/event-stream"
    return HostileInput(
        "v2 generate", "POST", _v2_path(rng, model, verb), headers, dumps(body, rng)
    )


# -- OpenAI -----------------------------------------------------------------------------------


def _model_name(rng: random.Random, good: str) -> Any:
    roll = rng.random()
    if roll < 0.75:
        return good
    return rng.choice([
        "nope", "", 5, None, ["tokens"], f"default/{good}", f"nope/{good}", f"a/b/{good}",
        "\u001b[31mtokens", "tokens\u0000", good.upper(), "batched", "hashembed", "tokens",
        odd_string(rng),
    ])  # fmt: skip


def _sampling(rng: random.Random, body: dict[str, Any]) -> None:
    for _ in range(rng.randrange(0, 3)):
        name = rng.choice(["max_tokens", "max_completion_tokens", "temperature", "top_p",
                           "top_k", "seed", "stop", "n", "stream", "presence_penalty",
                           "logprobs", "tools", "user", "frequency_penalty"])  # fmt: skip
        body[name] = rng.choice([
            *ODD_NUMBERS, 100000000, 2**70, odd_string(rng), ["a", 5], deep(rng), {"x": 1},
        ])  # fmt: skip


def openai_completion(rng: random.Random) -> HostileInput:
    body: dict[str, Any] = {"model": _model_name(rng, "tokens"), "prompt": _prompt(rng)}
    if rng.random() < 0.5:
        body["max_tokens"] = rng.randrange(1, 8)
    if rng.random() < 0.3:
        body["stream"] = True
    if rng.random() < 0.15:
        body["prompt"] = rng.choice([[1, 2, 3], ["a", "b"], [[1], [2]], None, 5, {"x": 1}])
    _sampling(rng, body)
    return _openai(rng, "OpenAI completions", "/v1/completions", body)


def openai_chat(rng: random.Random) -> HostileInput:
    messages: Any = [{"role": rng.choice(["user", "system", "assistant"]),
                      "content": _prompt(rng)} for _ in range(rng.randrange(1, 4))]  # fmt: skip
    roll = rng.random()
    if roll < 0.1:
        messages = rng.choice([[], None, "hi", [5], [{"role": "user"}], deep(rng, {})])
    elif roll < 0.25:
        messages[0]["content"] = rng.choice([
            [{"type": "text", "text": "hi"}], [{"type": "image_url", "image_url": {"url": "x"}}],
            [{"type": "text"}], 5, None, {"text": "x"}, [odd_string(rng)],
        ])  # fmt: skip
    elif roll < 0.3:
        messages[0]["role"] = rng.choice([5, None, "", odd_string(rng), "tool"])
    body: dict[str, Any] = {"model": _model_name(rng, "tokens"), "messages": messages}
    if rng.random() < 0.5:
        body["max_tokens"] = rng.randrange(1, 8)
    if rng.random() < 0.3:
        body["stream"] = True
    _sampling(rng, body)
    return _openai(rng, "OpenAI chat", "/v1/chat/completions", body)


def openai_embeddings(rng: random.Random) -> HostileInput:
    texts: Any = [_not_failing(_prompt(rng)[:200] or "t") for _ in range(rng.randrange(1, 5))]
    roll = rng.random()
    if roll < 0.05:
        texts = ["t"] * rng.choice([2048, 2049, 5000])
    elif roll < 0.2:
        texts = rng.choice([[], "", [""], [1, 2], [[1, 2]], None, 5, {"x": 1}, ["\ud800"],
                            [None], deep(rng, "a")])  # fmt: skip
    elif roll < 0.3:
        texts = _not_failing(odd_string(rng)) or "t"
    body: dict[str, Any] = {"model": _model_name(rng, "hashembed"), "input": texts}
    if rng.random() < 0.3:
        body["encoding_format"] = rng.choice(["float", "base64", "int8", "", None, 5])
    if rng.random() < 0.2:
        body["dimensions"] = rng.choice([*ODD_NUMBERS, 16, 15])
    if rng.random() < 0.1:
        body["user"] = rng.choice([5, None, odd_string(rng), {"id": 1}])
    return _openai(rng, "OpenAI embeddings", "/v1/embeddings", body)


def _openai(rng: random.Random, kind: str, path: str, body: Any) -> HostileInput:
    if rng.random() < 0.05:
        body = rng.choice([[], "x", None, 5, deep(rng, {})])
    text = dumps(body, rng)
    if rng.random() < 0.05:
        text = text[: rng.randrange(1, max(len(text), 2))]
    if rng.random() < 0.05:
        path = "/ns/" + rng.choice(["default", "nope", "%2e%2e"]) + path
    headers = {"Content-Type": "application/json"}
    if rng.random() < 0.2:
        headers["Accept"] = "text/event-stream"
    if rng.random() < 0.05:
        headers["X-Modelswap-Progress"] = rng.choice(["sse", "yes", ""])
    return HostileInput(kind, "POST", path, headers, text)


# -- encodings, headers, raw HTTP -------------------------------------------------------------


def odd_encoding(rng: random.Random) -> HostileInput:
    """A body that would be served, sent in an encoding or with headers it is not."""
    path, plain = rng.choice([
        ("/v2/models/batched/infer", json.dumps(_legal_infer(rng)).encode()),
        ("/v1/completions", json.dumps({"model": "tokens", "prompt": "a b", "max_tokens": 2}).encode()),
        ("/v1/embeddings", json.dumps({"model": "hashembed", "input": ["x"]}).encode()),
    ])  # fmt: skip
    headers = {"Content-Type": "application/json"}
    choice = rng.randrange(9)
    body = plain
    if choice == 0:
        body = plain.decode().encode(rng.choice(["utf-16", "utf-32", "utf-16-le"]))
    elif choice == 1:
        headers["Content-Encoding"] = "gzip"
        body = gzip.compress(plain, mtime=0)[: rng.choice([10, 30, 10**6])]
    elif choice == 2:
        headers["Content-Encoding"] = rng.choice(["br", "zstd", "compress", "gzip, gzip", "x"])
    elif choice == 3:  # a bomb: 64 MiB of zeros in about 64 KiB
        headers["Content-Encoding"] = "gzip"
        body = GZIP_BOMB
    elif choice == 4:
        headers["Content-Encoding"] = "deflate"
        body = rng.choice([zlib.compress(plain), b"\x78\x9c garbage", zlib.compress(plain)[:-4]])
    elif choice == 5:
        headers["Content-Type"] = rng.choice(["application/json; charset=utf-16",
                                              "multipart/form-data; boundary=x", "*/*"])  # fmt: skip
    elif choice == 6:
        # UTF-8 bytes read as Latin-1: bytes past ASCII on the wire (control characters
        # are left to raw_http: the client library refuses to send them)
        value = odd_string(rng).encode("utf-8", "surrogatepass").decode("latin-1")
        name = rng.choice(["traceparent", "tracestate", "X-Request-Id", "Accept"])
        headers[name] = "".join(c for c in value if c >= " " and c != "\x7f")
    elif choice == 7:
        headers["Expect"] = rng.choice(["100-continue", "200-ok", ""])
    else:
        body = base64.b64encode(plain)
    return HostileInput("odd encodings and headers", "POST", path, headers, body)


def _gzip_bomb() -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\0" * (1 << 20)
    out = [compressor.compress(chunk) for _ in range(64)]
    return b"".join(out) + compressor.flush()


GZIP_BOMB = _gzip_bomb()


def raw_http(rng: random.Random) -> HostileInput:
    """Bytes no HTTP client library would send. Where they leave the server waiting for
    more (a body shorter than its length, a chunk cut off, no request line yet), the sender
    half-closes after them; otherwise it waits for the answer (aiohttp's server takes a
    half-close for the client gone, and answers nothing)."""
    body = json.dumps(_legal_infer(rng)).encode()
    target = "/v2/models/batched/infer"
    choice = rng.randrange(10)
    if choice == 0:  # Content-Length larger than the body sent
        raw = _request(target, {"Content-Length": str(len(body) + 100)}, body)
    elif choice == 1:  # a chunk size that is not hex, or larger than what follows
        chunk = rng.choice(
            [b"zz\r\n", b"ffffffff\r\nabc\r\n", b"-1\r\n", b"3;" + b"e" * 9000 + b"\r\nabc\r\n"]
        )
        raw = _request(target, {"Transfer-Encoding": "chunked"}, chunk)
    elif choice == 2:  # header bytes outside Latin-1's printable range
        value = rng.choice([b"\xff\xfe", b"\xc3\xa9", b"\x00", b"\x1b[2J", "²".encode()])
        raw = _request(target, {"Content-Length": str(len(body))}, body,
                       extra=b"Inference-Header-Content-Length: " + value + b"\r\n")  # fmt: skip
    elif choice == 3:
        raw = _request(target, {"Content-Length": str(len(body)), "X-Long": "a" * rng.choice(
            [9000, 70000])}, body)  # fmt: skip
    elif choice == 4:  # two Content-Lengths that disagree
        raw = _request(target, {"Content-Length": str(len(body))}, body,
                       extra=f"Content-Length: {len(body) + 5}\r\n".encode())  # fmt: skip
    elif choice == 5:
        raw = rng.choice([b"GARBAGE\r\n\r\n", b"POST\r\n\r\n", b"\x16\x03\x01\x00\xa5\x01",
                          b"POST /v2/models/batched/infer HTTP/9.9\r\n\r\n", b"\r\n" * 50])  # fmt: skip
    elif choice == 6:
        raw = _request(target.replace("batched", rng.choice(["bat\x00ched", "%ff%fe", "é"])),
                       {"Content-Length": str(len(body))}, body)  # fmt: skip
    elif choice == 7:  # HTTP/1.0, no Host
        raw = f"POST {target} HTTP/1.0\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    elif choice == 8:  # both chunked and a length
        raw = _request(target, {"Content-Length": "3", "Transfer-Encoding": "chunked"},
                       f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")  # fmt: skip
    else:  # a body cut off mid-chunk
        raw = _request(target, {"Transfer-Encoding": "chunked"},
                       f"{len(body):x}\r\n".encode() + body[: len(body) // 2])  # fmt: skip
    return HostileInput("raw HTTP/1.1", "POST", target, raw=raw, half_close=choice in (0, 1, 5, 9))


def _request(target: str, headers: dict[str, str], body: bytes, extra: bytes = b"") -> bytes:
    head = f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + extra + b"\r\n" + body


# -- the mix ----------------------------------------------------------------------------------

#: Each family with its share of the inputs.
FAMILIES: tuple[tuple[Callable[[random.Random], HostileInput], int], ...] = (
    (v2_infer_json, 30),
    (v2_infer_binary, 15),
    (v2_generate, 10),
    (openai_completion, 12),
    (openai_chat, 12),
    (openai_embeddings, 10),
    (odd_encoding, 6),
    (raw_http, 5),
)


def hostile_inputs(seed: int, count: int) -> Iterator[HostileInput]:
    """`count` inputs drawn from FAMILIES by their shares, the same ones for a seed."""
    rng = random.Random(seed)
    makers = [maker for maker, _ in FAMILIES]
    weights = [share for _, share in FAMILIES]
    for _ in range(count):
        yield rng.choices(makers, weights)[0](rng)
