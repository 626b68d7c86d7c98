"""Settings of the node heartbeat (SwapNode status and the node Lease), read once at start."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_LEASE_NAMESPACE = "modelswap-node-leases"


@dataclass(frozen=True, kw_only=True)
class HeartbeatSettings:
    #: The Node this agent runs on; also the name of its SwapNode and its Lease.
    node_name: str
    #: A namespace that holds only node Leases (DESIGN.md §3).
    lease_namespace: str = DEFAULT_LEASE_NAMESPACE
    #: Written to the Lease's holderIdentity (e.g. the pod name); default: the node name.
    holder_identity: str | None = None
    #: How long a renewal vouches for the node; the operator calls it lost after this.
    lease_duration_seconds: int = 20
    renew_interval_seconds: float = 5.0
    #: How often the report is compared with what was last written (a nudge is sooner).
    status_interval_seconds: float = 10.0
    #: At most one status write per this many seconds, however often nudged.
    min_status_write_interval_seconds: float = 1.0
    #: How often the Node's labels and taints are read again.
    node_refresh_seconds: float = 60.0
    #: Bound of each API request.
    request_timeout_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("node_name must not be empty")
        if self.lease_duration_seconds < 1:
            raise ValueError("lease_duration_seconds must be at least 1")
        if not 0 < self.renew_interval_seconds < self.lease_duration_seconds:
            raise ValueError("renew_interval_seconds must be positive and below the lease duration")
        for name in (
            "status_interval_seconds",
            "node_refresh_seconds",
            "request_timeout_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.min_status_write_interval_seconds < 0:
            raise ValueError("min_status_write_interval_seconds must not be negative")

    @property
    def holder(self) -> str:
        return self.holder_identity or self.node_name
