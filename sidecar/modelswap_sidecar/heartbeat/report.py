"""What the agent reports about its node: a `NodeReport` from a provider it passes in.

The heartbeat adds the Node's labels and taints and writes the result to the SwapNode's
status whenever it differs from what was last written, so a provider should report
values that change when something a reader cares about changes: a free-memory figure that
moves on every call causes a write on every comparison (round it, or leave it out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from modelswap_api.models import Condition, GpuStatus, HostedModel


@dataclass(frozen=True, kw_only=True)
class NodeReport:
    agent_version: str
    #: URL of the agent's control API.
    endpoint: str | None = None
    #: URL of the agent's gateway.
    gateway_endpoint: str | None = None
    #: `grpc://host:port` of the gateway's gRPC front; None: not served.
    gateway_grpc_endpoint: str | None = None
    #: PEM of the control API's serving certificate, which the operator pins.
    certificate: str | None = None
    gpus: tuple[GpuStatus, ...] = ()
    models: tuple[HostedModel, ...] = ()
    conditions: tuple[Condition, ...] = ()


class ReportProvider(Protocol):
    """Called on the agent's event loop: must be quick and must not block."""

    def __call__(self) -> NodeReport: ...
