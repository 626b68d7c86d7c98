"""Every exception the policy package raises.

PolicyInputError   a snapshot or settings object is inconsistent (a caller's bug)
"""

from __future__ import annotations


class PolicyInputError(ValueError):
    """The inputs handed to the policy contradict themselves."""
