"""Errors of local mode.

LocalModeError          bad settings (a flag or file named in the message)
└── AlreadyRunningError another `modelswap up` holds the run directory
"""

from __future__ import annotations


class LocalModeError(Exception):
    pass


class AlreadyRunningError(LocalModeError):
    pass
