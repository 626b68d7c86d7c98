"""Request bodies read within limits: size (before and after decoding), time, encoding.

The gateway's server does not decode bodies itself (`auto_decompress=False`): aiohttp
inflates a gzip body as it arrives, inside the event loop and past any size limit, so a
260 KB gzip body of zeros (256 MiB inflated) held every other request for half a second.
Here a body is inflated in steps of at most `DECODE_STEP_BYTES`, the loop gets a turn
between steps, and inflating stops as soon as the decoded size passes the limit.

    body = await read_body(request, max_bytes=..., timeout_seconds=...)

answers, naming the limit:

- 413 PayloadTooLarge: more than `max_bytes` bytes sent, declared (`Content-Length`) or
  decoded;
- 408 RequestTimeout: the whole body did not arrive within `timeout_seconds` (a client
  trickling its body, slowloris);
- 415 UnsupportedContentEncoding: a `Content-Encoding` other than identity, gzip and
  deflate;
- 400 BadRequest: a gzip or deflate body that does not decode, is cut short, or has bytes
  after its end; a body the server's parser could not read (a chunk extension longer than
  its 8,190-byte line limit, a bad chunk size), with the parser's reason.

`decode_json` turns a body into JSON with the same care: UTF-8, nesting at most
`MAX_JSON_DEPTH`, no non-finite numbers, else 400.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from modelswap_api.json_input import JsonInputError, loads_bounded
from modelswap_sidecar.gateway.errors import BadRequestError, GatewayError

#: Decoded bytes produced by one inflating step before the event loop gets a turn.
DECODE_STEP_BYTES = 1 << 20
#: Deepest nesting a JSON body may have (an OpenAI chat request is about 4 levels).
MAX_JSON_DEPTH = 64
#: Encodings the gateway decodes (`x-gzip` is gzip's old name, RFC 9110).
ENCODINGS = ("identity", "gzip", "x-gzip", "deflate")


class PayloadTooLargeError(GatewayError):
    status = 413
    reason = "PayloadTooLarge"


class RequestTimeoutError(GatewayError):
    status = 408
    reason = "RequestTimeout"


class UnsupportedEncodingError(GatewayError):
    status = 415
    reason = "UnsupportedContentEncoding"


class _Inflater:
    """gzip or deflate, inflated in bounded steps. HTTP's `deflate` is the zlib format, but
    some clients send raw deflate: the first byte tells them apart (as aiohttp does)."""

    def __init__(self, encoding: str) -> None:
        self._encoding = encoding
        self._decoder: Any = None

    def _start(self, first: bytes) -> Any:
        if self._encoding == "deflate":
            zlib_header = first[0] & 0x0F == 8
            return zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)
        return zlib.decompressobj(16 + zlib.MAX_WBITS)

    async def feed(self, chunk: bytes, out: bytearray, max_bytes: int) -> None:
        if not chunk:
            return
        if self._decoder is None:
            self._decoder = self._start(chunk)
        decoder = self._decoder
        data = chunk
        while data:
            if decoder.eof:
                raise BadRequestError(f"the {self._encoding} body has bytes after its end")
            try:
                out += decoder.decompress(data, DECODE_STEP_BYTES)
            except zlib.error as e:
                raise BadRequestError(f"the body is not valid {self._encoding}: {e}") from e
            _check_size(len(out), max_bytes, decoded=True)
            data = decoder.unconsumed_tail
            if data:
                await asyncio.sleep(0)  # let the loop serve others between steps
        if decoder.eof and decoder.unused_data:
            raise BadRequestError(f"the {self._encoding} body has bytes after its end")

    def finish(self) -> None:
        if self._decoder is not None and not self._decoder.eof:
            raise BadRequestError(f"the {self._encoding} body is cut short")


def _check_size(size: int, max_bytes: int, *, decoded: bool = False) -> None:
    if size > max_bytes:
        what = "decoded body" if decoded else "body"
        raise PayloadTooLargeError(
            f"the {what} is larger than the gateway's limit of {max_bytes} bytes"
        )


def _encoding_of(request: web.BaseRequest) -> str:
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower() or "identity"
    if encoding not in ENCODINGS:
        raise UnsupportedEncodingError(
            f"Content-Encoding {encoding[:40]!r} is not supported: send identity, gzip or deflate"
        )
    return "gzip" if encoding == "x-gzip" else encoding


async def read_body(request: web.BaseRequest, *, max_bytes: int, timeout_seconds: float) -> bytes:
    """The request's body, decoded; a GatewayError as the module says when it cannot be."""
    encoding = _encoding_of(request)
    declared = request.content_length
    if declared is not None:
        _check_size(declared, max_bytes)
    content = request.content
    if encoding == "identity" and content.is_eof():
        # the whole body came with the headers (an inference request usually does): no
        # wait, so no timer and no copy
        body = content.read_nowait()
        _check_size(len(body), max_bytes)
        return body
    inflater = None if encoding == "identity" else _Inflater(encoding)
    out = bytearray()
    received = 0
    try:
        async with asyncio.timeout(timeout_seconds):
            async for chunk in request.content.iter_any():
                received += len(chunk)
                _check_size(received, max_bytes)
                if inflater is None:
                    out += chunk
                else:
                    await inflater.feed(chunk, out, max_bytes)
    except TimeoutError as e:
        raise RequestTimeoutError(
            f"the request body did not arrive within {timeout_seconds:g} s"
        ) from e
    except RequestPayloadError as e:
        cause = e.__cause__ or e
        reason = str(cause).replace("\n", " ").strip()
        raise BadRequestError(f"the request body could not be read: {reason[:200]}") from e
    if inflater is not None:
        inflater.finish()
    return bytes(out)


def decode_json(body: bytes) -> Any:
    """The body's JSON; BadRequestError when it is not UTF-8, not JSON, nested deeper than
    `MAX_JSON_DEPTH` or holds a non-finite number."""
    try:
        return loads_bounded(body, MAX_JSON_DEPTH)
    except JsonInputError as e:
        raise BadRequestError(str(e)) from e
