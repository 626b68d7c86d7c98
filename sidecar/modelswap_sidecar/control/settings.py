"""Settings of the control API, read once at start by the agent and passed down."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelswap_sidecar.control.certificate import ServingCertificate


@dataclass(frozen=True, kw_only=True)
class ControlSettings:
    node_name: str
    #: Bearer token file (a mounted Secret key); re-read when it changes.
    token_file: Path
    #: Small JSON file holding the highest desired-set revision seen.
    state_file: Path
    host: str = "0.0.0.0"  # the NetworkPolicy admits only the operator
    port: int = 9443
    #: Models missing from the set are unloaded after this long; the agent is fenced when
    #: Lease renewals and operator pushes have both failed for this long.
    grace_seconds: float = 90.0
    #: Off in local mode: there is no operator and no Lease.
    fencing_enabled: bool = True
    unload_check_interval_seconds: float = 1.0
    max_body_bytes: int = 16 << 20
    #: Longest a request's body may take to arrive once its headers have (408 after).
    body_timeout_seconds: float = 30.0
    #: Longest a connection may stay open without a complete request's headers (idle
    #: between keep-alive requests, or trickling them): closed after.
    idle_timeout_seconds: float = 75.0
    #: HTTPS with this certificate (self-signed at start or configured; the SwapNode
    #: publishes it and the operator pins it); None: plain HTTP (local mode, tests).
    tls: ServingCertificate | None = None
