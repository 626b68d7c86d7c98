"""Every exception of the engine, each carrying the wire `ErrorCode` clients and the
control API report.

    EngineError
    ├── NoCapacity        HBM budget (or the allocator) cannot fit the request
    ├── HostStoreFull     the host store's per-GPU capacity is exhausted
    ├── NotVouched        a client the runtime driver does not vouch for, or a wrong model
    ├── UnknownModel      no such model in the engine
    ├── WrongState        the operation is not valid in the model's current state
    │   └── Committing    a swap-out of a model whose weights are being committed (its
    │                     runtime loaded them inside `in_use()`): refused, or rolled back
    ├── ClientFailed      a client answered with an error, timed out or went away
    │                     (the operation was rolled back)
    ├── ProtocolViolation a malformed request
    └── ModelFailed       an unrecoverable error put the model in FAILED (e.g. its host
                          copy is gone); the reason is in its status
"""

from __future__ import annotations

from modelswap_api.wire import ErrorCode


class EngineError(Exception):
    code: ErrorCode = ErrorCode.INTERNAL


class NoCapacity(EngineError):  # noqa: N818 - named after the condition it reports
    code = ErrorCode.NO_CAPACITY


class HostStoreFull(EngineError):  # noqa: N818
    code = ErrorCode.HOST_STORE_FULL


class NotVouched(EngineError):  # noqa: N818
    code = ErrorCode.NOT_VOUCHED


class UnknownModel(EngineError):  # noqa: N818
    code = ErrorCode.NOT_FOUND


class WrongState(EngineError):  # noqa: N818
    code = ErrorCode.WRONG_STATE


class Committing(WrongState):
    """A model committing its weights is never a victim: its committer is inside
    `in_use()`, which a swap-out's drain waits for."""


class ClientFailed(EngineError):  # noqa: N818
    code = ErrorCode.ROLLED_BACK


class ProtocolViolation(EngineError):  # noqa: N818
    code = ErrorCode.PROTOCOL


class ModelFailed(EngineError):  # noqa: N818
    code = ErrorCode.MODEL_FAILED
