"""Whole answers compressed when the client asks (`Accept-Encoding: gzip` or `deflate`).

    response = await compressed(request, response)   # in `GatewayApp.handle`, last

A whole answer (a `web.Response` not yet sent: v2 infer in JSON or binary tensors,
generate, metadata, configuration, statistics, OpenAI non-streaming answers, errors) whose
type is JSON or binary tensors (`application/octet-stream`) and whose body holds at least
`MIN_COMPRESSED_BYTES` is compressed with the coding the client prefers (`chosen_coding`),
`Content-Encoding` set and `Content-Length` counting the compressed bytes. A smaller body is
sent as it is: below about one TCP segment, compressing saves no packet and costs CPU and
gzip's 18-byte frame.

With binary tensors, `Inference-Header-Content-Length` keeps counting the JSON header's
bytes before compression, as Triton's own server does (it answered an 8,268-byte binary
answer gzip'ed to 234 bytes with `Inference-Header-Content-Length: 268`) and as
tritonclient reads it: the client inflates the body, then splits it there.

Event streams (SSE: generate_stream, OpenAI `"stream": true`, progress streams) are never
compressed: each event must reach the client when it is written, so each would need a full
flush of the compressor, which frames every event anew and saves little on events of a
few dozen bytes, and a proxy or client that buffers a compressed stream until it has a
block would hold tokens back.

`deflate` is the zlib format (RFC 9110; what Triton sends and tritonclient inflates with
`zlib.decompress`). Level 1: on a 19.8 KB infer answer it gives 10.0 KB where level 6 gives
9.8 KB, for a third of the CPU (GATEWAY.md: the cost). Bodies of `THREAD_BYTES` or more are
compressed in the event loop's default executor (zlib releases the GIL), so a large answer
does not hold every other request of the node meanwhile.
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web

#: Smallest body compressed, in bytes (see the module).
MIN_COMPRESSED_BYTES = 1024
#: Bodies at least this large are compressed in a thread (about 1 ms of CPU at level 1).
THREAD_BYTES = 64 << 10
#: zlib's level: 1 is several times cheaper than the default 6 for a few percent more bytes.
LEVEL = 1
#: Content types compressed (the part before any `;`).
COMPRESSIBLE_TYPES = frozenset({"application/json", "application/octet-stream"})
#: zlib's window bits per coding: gzip's frame, zlib's.
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
#: Codings by the name a client may use; `x-gzip` is gzip's old name (RFC 9110).
_NAMES = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate"}


def chosen_coding(accept_encoding: str) -> str | None:
    """The coding to answer with for an `Accept-Encoding` value: gzip or deflate, whichever
    has the higher weight (gzip on a tie), or None. `*` stands for any coding not named;
    `q=0` refuses one; a weight that is not a number refuses it too."""
    weights: dict[str, float] = {}
    star: float | None = None
    for element in accept_encoding.split(","):
        name, _, params = element.partition(";")
        name = name.strip().lower()
        if not name:
            continue
        weight = 1.0
        for param in params.split(";"):
            key, eq, value = param.partition("=")
            if eq and key.strip().lower() == "q":
                try:
                    weight = float(value.strip())
                except ValueError:
                    weight = 0.0
                if not 0.0 <= weight <= 1.0:  # NaN included
                    weight = 0.0
        if name == "*":
            star = weight
        elif name in _NAMES:
            coding = _NAMES[name]
            weights[coding] = max(weights.get(coding, 0.0), weight)
    best: str | None = None
    best_weight = 0.0
    for coding in ("gzip", "deflate"):
        weight = weights.get(coding, star if star is not None else 0.0)
        if weight > best_weight:
            best, best_weight = coding, weight
    return best


def compress(body: bytes, coding: str) -> bytes:
    """`body` in `coding` (gzip or deflate)."""
    compressor = zlib.compressobj(LEVEL, zlib.DEFLATED, _WBITS[coding])
    return compressor.compress(body) + compressor.flush()


def _compressible(response: web.StreamResponse) -> bytes | None:
    """The body of a whole, unsent answer of a compressible type and size, else None."""
    if type(response) is not web.Response or response.prepared:
        return None
    body = response.body
    if not isinstance(body, bytes) or len(body) < MIN_COMPRESSED_BYTES:
        return None
    headers = response.headers
    if "Content-Encoding" in headers:
        return None
    content_type = headers.get("Content-Type", "").partition(";")[0].strip().lower()
    return body if content_type in COMPRESSIBLE_TYPES else None


async def compressed(request: web.BaseRequest, response: web.StreamResponse) -> web.StreamResponse:
    """`response` compressed as the request asks, when it can be (see the module). A
    request with `Accept-Encoding` whose answer could be compressed gets `Vary:
    Accept-Encoding`, compressed or not (`q=0`): the body depends on that header."""
    accept = request.headers.get("Accept-Encoding")
    if not accept:
        return response
    body = _compressible(response)
    if body is None:
        return response
    assert isinstance(response, web.Response)
    response.headers["Vary"] = "Accept-Encoding"
    coding = chosen_coding(accept)
    if coding is None:
        return response
    if len(body) >= THREAD_BYTES:
        loop = asyncio.get_running_loop()
        packed = await loop.run_in_executor(None, compress, body, coding)
    else:
        packed = compress(body, coding)
    response.body = packed  # Content-Length follows the body when the answer is sent
    response.headers["Content-Encoding"] = coding
    return response
