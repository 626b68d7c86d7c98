"""The client's exceptions."""

from __future__ import annotations

from modelswap_api.wire import ErrorCode


class ClientError(Exception):
    """The agent refused or failed a request; `code` is the wire error code."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INTERNAL) -> None:
        super().__init__(message)
        self.code = code
