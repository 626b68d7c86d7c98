"""Every error `modelswap simulate` raises: a scenario or trace it cannot use.

SimulateError
├── ScenarioError   the scenario YAML: the message names the file and the field
└── TraceError      the trace CSV: the message names the file, line and column
"""

from __future__ import annotations


class SimulateError(ValueError):
    """Input the simulator cannot use; the message says where and why, in one line."""


class ScenarioError(SimulateError):
    pass


class TraceError(SimulateError):
    pass
