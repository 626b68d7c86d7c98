"""Every exception of the node supervisor.

SupervisorError
├── SettingsError    the settings file or a flag is wrong (the message names the field)
└── IdentityError    a configured user or group does not exist
"""

from __future__ import annotations


class SupervisorError(Exception):
    """Base of the supervisor's errors."""


class SettingsError(SupervisorError, ValueError):
    """A setting is missing or wrong; the message names it."""


class IdentityError(SupervisorError, LookupError):
    """A configured user or group is unknown."""
