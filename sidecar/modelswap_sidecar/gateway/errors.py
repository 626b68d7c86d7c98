"""Every error the gateway answers with, and what each becomes on the wire.

    GatewayError                    status, reason, message, retry_after_seconds
    ├── BadRequestError             400 BadRequest        malformed body, unsupported field
    │   └── GenerationBoundError    400 GenerationBound   a generate request asks more tokens
    │                                                     or sends a longer prompt than its
    │                                                     model's spec.gateway bounds
    ├── NotAnEmbeddingModelError    400 NotAnEmbeddingModel `/v1/embeddings` for a model whose
    │                                                     configuration lacks the contract's
    │                                                     tensors (the message names them)
    ├── NamespaceRequiredError      400 NamespaceRequired no Service host, no /ns/ prefix,
    │                                                     and not local mode
    ├── RouteNotFoundError          404 NotFound          a path the gateway does not serve
    ├── MethodNotAllowedError       405 MethodNotAllowed  a path served under another method
    ├── ExpectationFailedError      417 ExpectationFailed an `Expect` other than 100-continue
    ├── UnknownModelError           404 ModelNotFound     a name the node was not told of
    ├── ModelNotKnownYetError       503 ModelNotKnownYet  + Retry-After: the node does not know
    │                                                     its desired set yet, or has not
    │                                                     taken the model back yet
    ├── AmbiguousModelError         409 AmbiguousModel    a bare name held by several namespaces
    ├── QueueFullError              429 QueueFull         + Retry-After
    ├── QueueTimeoutError           503 QueueTimeout      + Retry-After (the swap-in goes on)
    ├── TritonNotReadyError         503 TritonNotReady    /v2/health/ready while Triton is not
    ├── ModelSwappedOutError        503 ModelSwappedOut   + Retry-After: metadata of a model
    │                                                     Triton does not hold now
    ├── SwapInFailedError           503 SwapInFailed      + Retry-After; the agent raises it from
    │                                                     `ensure_resident` with its reason
    ├── UpstreamError               503 UpstreamUnavailable + Retry-After: Triton did not
    │                                                     answer, or its answer broke off
    ├── RequestEndedError           503 DrainDeadline     + Retry-After: the model's swap-out
    │                                                     waited its drain timeout for this
    │                                                     request, which the gateway ended
    ├── BadModelAnswerError         502 BadModelAnswer    the model answered, but not what its
    │                                                     contract promised (an embedding of
    │                                                     the wrong shape)
    └── TritonRefusedError          Triton's status, TritonError: Triton's own refusal,
                                    relayed (OpenAI routes)

`ModelStreamError` (not a GatewayError) is a model's error event inside a `generate_stream`
answer; the OpenAI routes report it as a 500.

The KServe v2 routes render them as `{"error": message, "reason": reason}`, the OpenAI
routes as `{"error": {"message", "type", "code"}}`.
"""

from __future__ import annotations

from collections.abc import Sequence


class GatewayError(Exception):
    status = 500
    reason = "InternalError"

    def __init__(self, message: str, *, retry_after_seconds: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_seconds = retry_after_seconds


class BadRequestError(GatewayError):
    status = 400
    reason = "BadRequest"


class GenerationBoundError(BadRequestError):
    reason = "GenerationBound"


class NamespaceRequiredError(GatewayError):
    status = 400
    reason = "NamespaceRequired"


class RouteNotFoundError(GatewayError):
    status = 404
    reason = "NotFound"


class MethodNotAllowedError(GatewayError):
    status = 405
    reason = "MethodNotAllowed"


class ExpectationFailedError(GatewayError):
    status = 417
    reason = "ExpectationFailed"


class UnknownModelError(GatewayError):
    status = 404
    reason = "ModelNotFound"


class ModelNotKnownYetError(GatewayError):
    status = 503
    reason = "ModelNotKnownYet"


class AmbiguousModelError(GatewayError):
    status = 409
    reason = "AmbiguousModel"

    def __init__(self, message: str, candidates: Sequence[str]) -> None:
        super().__init__(message)
        self.candidates = tuple(candidates)


class QueueFullError(GatewayError):
    status = 429
    reason = "QueueFull"


class QueueTimeoutError(GatewayError):
    status = 503
    reason = "QueueTimeout"


class TritonNotReadyError(GatewayError):
    status = 503
    reason = "TritonNotReady"


class ModelSwappedOutError(GatewayError):
    status = 503
    reason = "ModelSwappedOut"


class SwapInFailedError(GatewayError):
    status = 503
    reason = "SwapInFailed"


class UpstreamError(GatewayError):
    status = 503
    reason = "UpstreamUnavailable"


class RequestEndedError(GatewayError):
    status = 503
    reason = "DrainDeadline"


class NotAnEmbeddingModelError(GatewayError):
    status = 400
    reason = "NotAnEmbeddingModel"


class BadModelAnswerError(GatewayError):
    status = 502
    reason = "BadModelAnswer"


class TritonRefusedError(GatewayError):
    reason = "TritonError"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ModelStreamError(Exception):
    """The model answered an error inside its stream."""
