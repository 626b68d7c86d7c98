"""Wire types shared by the agent and the client library: error codes and messages.

Standard library only: the client library imports this module inside model processes
(Triton python-backend stubs) whose environment has none of our other dependencies.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """Machine-readable error codes carried in agent replies (control API and client socket)."""

    BAD_REQUEST = "BadRequest"
    UNAUTHORIZED = "Unauthorized"
    FORBIDDEN = "Forbidden"
    NOT_FOUND = "NotFound"
    CONFLICT = "Conflict"
    STALE = "Stale"
    NO_CAPACITY = "NoCapacity"
    HOST_STORE_FULL = "HostStoreFull"
    NOT_VOUCHED = "NotVouched"
    BAD_SOURCE = "BadSource"
    INTERNAL = "Internal"
