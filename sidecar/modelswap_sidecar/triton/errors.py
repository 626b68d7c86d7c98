"""Every exception of the Triton driver, each carrying the wire `ErrorCode` the control API
reports.

    TritonError
    ├── TritonStartFailed     the tritonserver process exited or was not ready in time
    ├── TritonUnavailable     Triton did not answer (connection refused, reset, timeout)
    ├── ModelConfigInvalid    the model's config.pbtxt is missing or does not parse
    ├── ModelLoadFailed       Triton refused to load the model (its message is kept)
    └── ModelNotLoaded        the model is not loaded (statistics, readiness of an unknown model)
"""

from __future__ import annotations

from modelswap_api.wire import ErrorCode


class TritonError(Exception):
    code: ErrorCode = ErrorCode.INTERNAL


class TritonStartFailed(TritonError):  # noqa: N818 - named after the condition it reports
    code = ErrorCode.INTERNAL


class TritonUnavailable(TritonError):  # noqa: N818
    code = ErrorCode.TIMEOUT


class ModelConfigInvalid(TritonError):  # noqa: N818
    code = ErrorCode.BAD_SOURCE


class ModelLoadFailed(TritonError):  # noqa: N818
    code = ErrorCode.INTERNAL


class ModelNotLoaded(TritonError):  # noqa: N818
    code = ErrorCode.NOT_FOUND
