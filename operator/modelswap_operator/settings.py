"""The operator's settings: read once at start (flags, with environment fallbacks read by
the command) into one frozen object that is passed down. Nothing here reads the
environment.

`grace_seconds` must equal every agent's `control.graceSeconds`: the operator re-pushes each
node's set every grace/3, and an agent that heard neither its Lease renewals nor a push for
the grace period stops loading (fencing). The chart sets both from one value.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelswap_api.defaults import BUILTIN_DEFAULTS

DEFAULT_NODE_LEASE_NAMESPACE = "modelswap-node-leases"
DEFAULT_LEADER_LEASE = "modelswap-operator"
DEFAULT_TOKEN_SECRET = "modelswap-control-token"
#: The key of the token Secret that holds the bearer token (the agents mount it as a file).
TOKEN_KEY = "token"


@dataclass(frozen=True, kw_only=True)
class OperatorSettings:
    #: None: the in-cluster service account.
    kubeconfig: Path | None = None
    #: The namespaces whose ModelDeployments this operator serves; empty: every namespace.
    namespaces: tuple[str, ...] = ()
    #: Where the operator may read models' credentialsSecretRef Secrets. None: in every
    #: namespace it serves (the chart's `operator.credentials.access: cluster`); a tuple:
    #: only in these (`optIn`; the chart grants `get secrets` there alone), and a model
    #: elsewhere is told to opt its namespace in, with no read attempted.
    credential_namespaces: tuple[str, ...] | None = None
    #: The operator's own namespace: its leader Lease and the control token Secret.
    namespace: str = "modelswap-system"
    #: The pod name (or any stable name); each start appends a nonce for the Lease holder.
    identity: str = "modelswap-operator"
    leader_lease: str = DEFAULT_LEADER_LEASE
    #: Whole seconds (a Lease holds whole seconds).
    leader_lease_seconds: int = 15
    leader_renew_seconds: float = 5.0
    #: Where the agents keep their per-node Leases (their liveness).
    node_lease_namespace: str = DEFAULT_NODE_LEASE_NAMESPACE
    #: A node whose Lease is older than this is lost; equals the agents' graceSeconds.
    grace_seconds: float = 90.0
    #: A SwapNode whose node's Lease has been stale this long (counted from when the node
    #: was lost: renewed + grace) is deleted; an agent that comes back creates it again.
    dead_node_retention_seconds: float = 600.0
    token_secret: str = DEFAULT_TOKEN_SECRET
    #: Cluster policy defaults (complete; `modelswap_api.defaults.check_defaults`).
    defaults: Mapping[str, Any] = field(default_factory=lambda: copy.deepcopy(BUILTIN_DEFAULTS))
    #: How long the loop gathers changes before it plans (one plan per batch).
    batch_seconds: float = 0.2
    #: The loop's turn when nothing changed: Lease staleness and heartbeat pushes.
    tick_seconds: float = 1.0
    push_timeout_seconds: float = 10.0
    #: Pushes and deletes in flight at once (each to a different node).
    max_parallel_calls: int = 32
    #: Threads for blocking Kubernetes calls.
    kube_threads: int = 8
    #: Talk plain HTTP to agents whose endpoint says http:// (tests; local experiments).
    allow_plain_http: bool = False
    #: /healthz, /readyz and /metrics; port 0: none.
    http_host: str = "0.0.0.0"
    http_port: int = 8080
    log_level: str = "info"
    json_logs: bool = True

    @property
    def push_interval_seconds(self) -> float:
        """Heartbeat pushes: every grace/3, so two may be lost before an agent fences."""
        return self.grace_seconds / 3
