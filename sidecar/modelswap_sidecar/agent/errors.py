"""Every exception of the agent package.

AgentError
├── SettingsError     the settings file or flags are unusable (names the key)
├── StartupError      the settings cannot work on this machine (no CUDA GPU for cuda-vmm,
│                     a kubeconfig that does not load); names the key; exit status 2
└── LoadError         a model could not be loaded; `reason` is CamelCase (BadSource,
                      LoadFailed, NoRoom, ...) and the message names the field when
                      the spec is at fault
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of the agent's errors."""


class SettingsError(AgentError):
    pass


class StartupError(AgentError):
    pass


class LoadError(AgentError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
