"""The gRPC front's one channel to Triton's own gRPC port (`inference.GRPCInferenceService`),
and Triton's failures as the gateway's errors.

    upstream = GrpcUpstream("127.0.0.1:8001", retry_after_seconds=1)
    await upstream.start()
    response = await upstream.call("ModelInfer", request)   # TritonRpcError / UpstreamError
    await upstream.close()

A failure to reach Triton (it died or restarts: gRPC's UNAVAILABLE before any answer) is
an `UpstreamError` (UNAVAILABLE with retry information to the client, as the HTTP front's
503 `UpstreamUnavailable`); Triton's own refusal is a `TritonRpcError` carrying Triton's
status code, relayed to the client with the UID-derived name replaced by the user's.
Triton's messages lose tracebacks and absolute paths (`rewrite.public_message`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc  # type: ignore[import-untyped]  # no stubs ship with grpcio
from tritonclient.grpc import service_pb2, service_pb2_grpc

from modelswap_sidecar.gateway.errors import GatewayError, UpstreamError
from modelswap_sidecar.gateway.rewrite import public_message

logger = logging.getLogger(__name__)

#: Request metadata passed on to Triton (tracing); the rest is the gateway's business.
FORWARDED_METADATA = ("traceparent", "tracestate")


class TritonRpcError(GatewayError):
    """Triton answered a call with an error status: relayed with its code."""

    reason = "TritonError"

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.code = code
        self.status = _HTTP_OF_CODE.get(code, 500)


#: The HTTP status a Triton gRPC code stands for in the gateway's request counts.
_HTTP_OF_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.CANCELLED: 499,
}


class GrpcUpstream:
    """One HTTP/2 channel to Triton's gRPC port, multiplexing every call."""

    def __init__(
        self, target: str, *, retry_after_seconds: int, max_message_bytes: int = 64 << 20
    ) -> None:
        self.target = target
        self._retry_after_seconds = retry_after_seconds
        self._max_message_bytes = max_message_bytes
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

    async def start(self) -> None:
        size = self._max_message_bytes
        self._channel = grpc.aio.insecure_channel(
            self.target,
            options=[
                ("grpc.max_send_message_length", size),
                # Triton's answers can be larger than the requests (outputs), bounded by it
                ("grpc.max_receive_message_length", -1),
                # Triton restarts on the same port: reconnect soon rather than back off long
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def call(
        self, method: str, request: Any, metadata: Sequence[tuple[str, str]] = ()
    ) -> Any:
        """Triton's answer to the unary `method`; TritonRpcError or UpstreamError."""
        if self._stub is None:
            raise self._unavailable("the gateway is not started")
        try:
            return await getattr(self._stub, method)(request, metadata=tuple(metadata))
        except grpc.aio.AioRpcError as e:
            raise self.error_of(e, method) from e

    def stream(
        self, requests: AsyncIterator[service_pb2.ModelInferRequest],
        metadata: Sequence[tuple[str, str]] = (),
    ) -> Any:  # fmt: skip
        """A `ModelStreamInfer` call to Triton fed from `requests` (read its answers with
        `async for`; `error_of` translates its failure)."""
        if self._stub is None:
            raise self._unavailable("the gateway is not started")
        return self._stub.ModelStreamInfer(requests, metadata=tuple(metadata))

    def error_of(self, e: grpc.aio.AioRpcError, method: str) -> GatewayError:
        code, details = e.code(), e.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE and _not_reached(details):
            logger.warning("Triton's gRPC port did not answer %s: %s", method, details)
            return self._unavailable(f"Triton did not answer: {details}")
        return TritonRpcError(public_message(details), code)

    def _unavailable(self, message: str) -> UpstreamError:
        return UpstreamError(message, retry_after_seconds=self._retry_after_seconds)


def _not_reached(details: str) -> bool:
    """gRPC's own words for a connection that failed or broke (not Triton's UNAVAILABLE for
    a model it does not hold)."""
    lowered = details.lower()
    return any(
        words in lowered
        for words in ("failed to connect", "connection refused", "socket closed",
                      "connection reset", "broken pipe", "recvmsg", "connect failed",
                      "connections to all backends failing", "goaway")
    )  # fmt: skip


def forwarded_metadata(metadata: Sequence[tuple[str, str | bytes]] | None) -> list[tuple[str, str]]:
    """The client's metadata Triton gets."""
    out = []
    for key, value in metadata or ():
        if key.lower() in FORWARDED_METADATA and isinstance(value, str):
            out.append((key.lower(), value))
    return out
