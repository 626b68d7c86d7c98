"""Settings of the gateway, read once at start by the agent (or local mode) and passed down."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    #: Triton's HTTP endpoint, e.g. `http://127.0.0.1:8000`.
    upstream_url: str
    host: str = "0.0.0.0"
    port: int = 8080
    #: Local mode: a request without a namespace may name a model by its bare name when
    #: exactly one model carries it. Off in a cluster, where the Service host or a
    #: `/ns/{namespace}/` prefix must say which namespace.
    local_mode: bool = False
    #: `Retry-After` on 429 (queue full), 503 (queue timeout, failed swap-in).
    retry_after_seconds: int = 1
    #: How often a client that asked for progress gets a `: swap-in <state>` line.
    progress_interval_seconds: float = 1.0
    #: Largest request body accepted, sent and decoded (v2 infer bodies carry tensors).
    max_body_bytes: int = 64 << 20
    #: Largest OpenAI request body (JSON text, parsed in the event loop: a long prompt is
    #: well under it).
    max_openai_body_bytes: int = 8 << 20
    #: Longest a request's body may take to arrive once its headers have (408 after).
    body_timeout_seconds: float = 60.0
    #: Longest a connection may stay open without a complete request's headers: idle
    #: between keep-alive requests, or trickling its headers (closed after).
    idle_timeout_seconds: float = 75.0
    #: Client connections open at once at most; past it the longest-idle are closed to
    #: admit new ones, and new ones are refused while none is idle (`connections`). None:
    #: the room `reserve_file_descriptors` leaves under the open-files limit at start.
    max_connections: int | None = None
    #: Client connections from one address at most; None: a quarter of `max_connections`.
    max_connections_per_address: int | None = None
    #: File descriptors the gateway's client connections leave to the rest of the agent
    #: (the engine's model connections and memory chunks, Triton connections, the control
    #: API and metrics servers, state files). None: a quarter of the open-files limit, at
    #: least 1,024 and at most half of it.
    reserve_file_descriptors: int | None = None
    #: Connections to Triton at most (more requests wait for one).
    upstream_connections: int = 256
    upstream_connect_timeout_seconds: float = 10.0
    #: Longest silence from Triton while reading an answer (a token stream's gap included);
    #: None waits for ever.
    upstream_read_timeout_seconds: float | None = 600.0
