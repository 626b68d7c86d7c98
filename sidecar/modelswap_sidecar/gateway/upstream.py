"""The gateway's one connection pool to Triton, and its errors as `UpstreamError`.

Only failures of the call to Triton become `UpstreamError` (503 with `Retry-After`: Triton
died or restarts, and the supervisor brings it back, so the client should send again); a
failure to write to the gateway's own client is not Triton's and is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping

import aiohttp

from modelswap_sidecar.gateway.errors import UpstreamError
from modelswap_sidecar.gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)

#: Request headers passed on to Triton; the rest (Host, Connection, Accept-Encoding, ...)
#: are the gateway's business. Not Content-Encoding: the gateway's server has already
#: decoded a gzip or deflate body (aiohttp decompresses request bodies), so Triton gets
#: plain bytes; passing the header on made Triton decode them again and answer an empty
#: output. Inference-Header-Content-Length counts the uncompressed JSON header, as sent.
FORWARDED_REQUEST_HEADERS = (
    "Content-Type",
    "Inference-Header-Content-Length",
    "traceparent",
    "tracestate",
)


class Upstream:
    def __init__(self, settings: GatewaySettings) -> None:
        self._settings = settings
        self._base = settings.upstream_url.rstrip("/")
        if "://" not in self._base:
            self._base = "http://" + self._base
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        settings = self._settings
        connector = aiohttp.TCPConnector(limit=settings.upstream_connections, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=settings.upstream_connect_timeout_seconds,
            sock_read=settings.upstream_read_timeout_seconds,
        )
        # Triton answers uncompressed (no Accept-Encoding is sent), so bodies can be renamed.
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, trust_env=False
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def open(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        json_body: object = None,
        headers: Mapping[str, str] | None = None,
    ) -> aiohttp.ClientResponse:
        """Send a request; the caller releases the response (`async with`)."""
        if self._session is None:
            raise self._error("the gateway is not started")
        sent = {"Accept-Encoding": "identity", **(headers or {})}
        try:
            return await self._session.request(
                method,
                self._base + path,
                data=body,
                json=json_body,
                headers=sent,
                allow_redirects=False,
            )
        except (TimeoutError, aiohttp.ClientError) as e:
            logger.warning("Triton did not answer %s %s: %s", method, path, e)
            raise self._error(f"Triton did not answer: {e or type(e).__name__}") from e

    async def read(self, response: aiohttp.ClientResponse) -> bytes:
        try:
            return await response.read()
        except (TimeoutError, aiohttp.ClientError) as e:
            raise self._error(f"Triton's answer broke off: {e or type(e).__name__}") from e

    async def chunks(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """Bytes as Triton sends them, each as soon as it arrives."""
        stream = response.content.iter_any().__aiter__()
        while True:
            try:
                chunk = await stream.__anext__()
            except StopAsyncIteration:
                return
            except (TimeoutError, aiohttp.ClientError) as e:
                raise self._error(f"Triton's stream broke off: {e or type(e).__name__}") from e
            yield chunk

    def _error(self, message: str) -> UpstreamError:
        return UpstreamError(message, retry_after_seconds=self._settings.retry_after_seconds)


def forwarded_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in FORWARDED_REQUEST_HEADERS if name in headers}
