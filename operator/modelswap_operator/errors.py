"""Every exception of the operator package.

OperatorError
├── SettingsError        a flag, environment value or defaults file is invalid
├── TermExhausted        an agent has seen the highest term the control API allows
├── CredentialsNotPermitted  a model's credentials Secret may not be read: its namespace
│                        did not opt in, or RBAC refused the read (also a ValueError, as
│                        every unusable credentials Secret is in desired.py)
└── AgentError           a node agent's control API call failed
    ├── AgentUnreachable connection refused, reset or timed out
    ├── AgentUntrusted   the agent's certificate is not the one its SwapNode publishes,
    │                    or it offers plain HTTP where that is off
    └── AgentRefused     the agent answered 4xx/5xx (`status`, `reason`, `field`)
"""

from __future__ import annotations


class OperatorError(Exception):
    pass


class SettingsError(OperatorError):
    pass


class TermExhausted(OperatorError):  # noqa: N818 - a state, like the API's reasons
    pass


class CredentialsNotPermitted(OperatorError, ValueError):  # noqa: N818 - a state, as above
    pass


class AgentError(OperatorError):
    pass


class AgentUnreachable(AgentError):  # noqa: N818 - reads as a state, like the API's reasons
    pass


class AgentUntrusted(AgentError):  # noqa: N818
    pass


class AgentRefused(AgentError):  # noqa: N818
    def __init__(self, message: str, *, status: int, reason: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.field = field
