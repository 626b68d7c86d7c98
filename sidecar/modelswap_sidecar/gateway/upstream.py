"""The gateway's one connection pool to Triton (`http1`), and its errors as `UpstreamError`.

Only failures of the call to Triton become `UpstreamError` (503 with `Retry-After`: Triton
died or restarts, and the supervisor brings it back, so the client should send again); a
failure to write to the gateway's own client is not Triton's and is left alone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from urllib.parse import quote, urlsplit

from modelswap_sidecar.gateway.errors import BadRequestError, UpstreamError
from modelswap_sidecar.gateway.http1 import Answer, ConnectionPool
from modelswap_sidecar.gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)

#: Request headers passed on to Triton; the rest (Host, Connection, Accept-Encoding, ...)
#: are the gateway's business. Not Content-Encoding: the gateway's server has already
#: decoded a gzip or deflate body (`bodies.read_body`), so Triton gets plain bytes; passing
#: the header on made Triton decode them again and answer an empty output.
#: Inference-Header-Content-Length counts the uncompressed JSON header, as sent.
FORWARDED_REQUEST_HEADERS = (
    "Content-Type",
    "Inference-Header-Content-Length",
    "traceparent",
    "tracestate",
)
#: Sent with every request: Triton answers uncompressed, so answers can be renamed.
_ALWAYS = "Accept-Encoding: identity\r\n"
_JSON = "Content-Type: application/json\r\n"


class Upstream:
    def __init__(self, settings: GatewaySettings) -> None:
        self._settings = settings
        url = (
            settings.upstream_url
            if "://" in settings.upstream_url
            else ("http://" + settings.upstream_url)
        )
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the gateway speaks plain HTTP to Triton, not {url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._pool: ConnectionPool | None = None

    async def start(self) -> None:
        settings = self._settings
        self._pool = ConnectionPool(
            self._host,
            self._port,
            limit=settings.upstream_connections,
            connect_timeout_seconds=settings.upstream_connect_timeout_seconds,
            read_timeout_seconds=settings.upstream_read_timeout_seconds,
        )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def open_connections(self) -> int:
        return 0 if self._pool is None else self._pool.open_connections

    async def open(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        json_body: object = None,
        headers: str = "",
    ) -> Answer:
        """Send a request (`headers`: lines from `forwarded_headers`); the caller releases
        the answer (`async with`)."""
        if self._pool is None:
            raise self._error("the gateway is not started")
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers = _JSON + headers
        try:
            return await self._pool.request(method, path, _ALWAYS + headers, body or b"")
        except (TimeoutError, OSError) as e:
            logger.warning("Triton did not answer %s %s: %s", method, path, e)
            raise self._error(f"Triton did not answer: {e or type(e).__name__}") from e

    async def read(self, answer: Answer) -> bytes:
        try:
            return await answer.read()
        except (TimeoutError, OSError) as e:
            raise self._error(f"Triton's answer broke off: {e or type(e).__name__}") from e

    async def chunks(self, answer: Answer) -> AsyncIterator[bytes]:
        """Bytes as Triton sends them, each as soon as it arrives."""
        stream = answer.chunks().__aiter__()
        while True:
            try:
                chunk = await stream.__anext__()
            except StopAsyncIteration:
                return
            except (TimeoutError, OSError) as e:
                raise self._error(f"Triton's stream broke off: {e or type(e).__name__}") from e
            yield chunk

    def _error(self, message: str) -> UpstreamError:
        return UpstreamError(message, retry_after_seconds=self._settings.retry_after_seconds)


def forwarded_headers(headers: Mapping[str, str]) -> str:
    """The request's headers Triton gets, as header lines."""
    lines = ""
    for name in FORWARDED_REQUEST_HEADERS:
        value = headers.get(name)
        if value is not None:
            if "\r" in value or "\n" in value:  # the server's parser refuses them already
                raise BadRequestError(f"the {name} header holds a line break")
            try:
                value.encode("latin-1")  # HTTP/1.1 header values are bytes, Latin-1 at most
            except UnicodeEncodeError as e:
                raise BadRequestError(
                    f"the {name} header holds a character outside Latin-1 at {e.start}"
                ) from e
            lines += f"{name}: {value}\r\n"
    return lines


def model_path(triton_name: str, version: str | None, tail: str = "") -> str:
    """Triton's path for a model (and version, as the client wrote it) plus `tail`."""
    if version is None:
        return f"/v2/models/{triton_name}{tail}"
    return f"/v2/models/{triton_name}/versions/{quote(version, safe='')}{tail}"
