"""Every exception the control package raises, and the HTTP status each becomes.

ControlError
├── RevisionStoreError   the revision state file cannot be read or written
├── DesiredStoreError    503: the desired entries could not be saved (a restarted agent
│                        would take back an older set); the agent keeps serving
├── RefusedError         409: an older term or revision, another node's set, a model still
│                        desired, a load while fenced, a backend's refusal; carries `reason`
├── UnknownModelError    404: no model with that uid on this node (backends raise it)
├── BackendError         the backend broke its contract (500)
└── CertificateError     the serving certificate cannot be made, read or loaded
"""

from __future__ import annotations


class ControlError(Exception):
    """Base of the control package's errors."""


class RevisionStoreError(ControlError):
    """The state file holding the highest revision seen is unreadable or unwritable."""


class DesiredStoreError(ControlError):
    """The backend could not save its desired entries (see `NodeBackend.save_desired`)."""


class RefusedError(ControlError):
    """A request that cannot be honoured as things stand; `reason` is CamelCase."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class UnknownModelError(ControlError, LookupError):
    def __init__(self, uid: str) -> None:
        super().__init__(f"no model with uid {uid!r} on this node")
        self.uid = uid


class BackendError(ControlError):
    """The backend answered something its interface rules out."""


class CertificateError(ControlError):
    """The control API's serving certificate cannot be made, read or loaded."""
