"""The agent's settings as passed down: frozen dataclasses (`AgentSettings` and its
sections). The document they are read from is described in `agent/settings/document.py`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from modelswap_sidecar.heartbeat.settings import HeartbeatSettings

ALLOCATORS = ("sim", "cuda-vmm", "auto")
#: `control.tls`: `auto` serves HTTPS in cluster mode or with a configured certificate;
#: `off` keeps plain HTTP (local mode, tests that ask for it).
TLS_MODES = ("auto", "off")


@dataclass(frozen=True, kw_only=True)
class SimGpu:
    """One `gpus` entry: a simulated GPU (sim), or a real GPU chosen by UUID (cuda-vmm)."""

    uuid: str
    #: sim only (required there); a real GPU's HBM total comes from NVML.
    capacity_bytes: int | None = None
    reserve_bytes: int = 0
    #: sim only: the host link speed reported in the SwapNode; None: `pace_gbps` when set,
    #: else measured once at start.
    link_gbps: float | None = None
    #: sim only: the emulated link (GB/s, 10^9 B/s) every model on this GPU paces its copies
    #: to (the engine tells each client at registration); None: copies at machine speed.
    #: Figures measured with it are "scaled", not link measurements.
    pace_gbps: float | None = None


@dataclass(frozen=True, kw_only=True)
class CudaSettings:
    """The `cuda` section: the cuda-vmm allocator and its link probe."""

    chunk_bytes: int = 256 << 20
    max_chunk_bytes: int = 1 << 30
    #: Measure each GPU's host link once at start (a short-lived child process).
    link_probe: bool = True
    link_probe_bytes: int = 256 << 20
    link_probe_timeout_seconds: float = 60.0


@dataclass(frozen=True, kw_only=True)
class KubeAccess:
    """Cluster mode: how the agent reaches the API server for its SwapNode and Lease."""

    #: None: the in-cluster service account.
    kubeconfig: Path | None = None
    #: The host the SwapNode's endpoints name (the pod IP); None: the control host when it
    #: is a specific address, else this host's name.
    advertise_host: str | None = None
    heartbeat: HeartbeatSettings


@dataclass(frozen=True, kw_only=True)
class TritonEndpoint:
    url: str  # host:port of Triton's HTTP endpoint
    #: host:port of Triton's gRPC endpoint (`triton.grpcUrl`): the gateway's gRPC front
    #: forwards there; None: unknown (then no gRPC front).
    grpc_url: str | None = None
    repository: Path
    #: Where the current Triton's pid is read (it changes when Triton restarts): a file
    #: holding the pid, or the supervisor's state file (`children.runtime.pid`).
    pid_file: Path | None = None
    supervisor_state_file: Path | None = None
    load_timeout_seconds: float = 600.0
    request_timeout_seconds: float = 10.0


@dataclass(frozen=True, kw_only=True)
class PolicyLoopSettings:
    interval_seconds: float = 0.5
    high_watermark_fraction: float = 0.95
    low_watermark_fraction: float = 0.85
    #: A failed load (bad source, refused by Triton) is retried after this long, or at
    #: once when its entry changes.
    retry_failed_seconds: float = 60.0
    drain_timeout_seconds: float = 60.0
    #: A swap-in that only busy models could make room for waits this long (from its
    #: first ask) for one of them to become idle before it drains one (`WaitingForIdle`,
    #: docs/POLICY.md); past the actuator's 30 s admission deadline it drains one anyway.
    busy_victim_wait_seconds: float = 10.0
    #: A model process (a Triton stub attached through the client library) that sent no
    #: heartbeat for this long answers nothing (stopped, wedged; one busy with a long
    #: request still sends them, every 5 s): the agent kills it and its model is loaded
    #: again from the host copy (docs/AGENT.md, "Failures"). 0: never.
    unresponsive_after_seconds: float = 20.0


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    node_name: str
    local_mode: bool = False
    allocator: str = "sim"
    gpus: tuple[SimGpu, ...]
    #: HBM kept back on a GPU that has no `gpus` entry of its own (cuda-vmm managing every
    #: GPU it finds); entries without `reserveBytes` take it too.
    gpu_reserve_bytes: int = 0
    pool_chunk_bytes: int = 32 << 20
    cuda: CudaSettings = CudaSettings()
    overhead_bytes_per_process: int = 0
    host_store_dir: Path
    host_store_capacity_bytes: int  # per GPU
    socket_dir: Path
    state_dir: Path
    source_cache_dir: Path
    source_cache_capacity_bytes: int = 20 << 30
    source_max_download_bytes: int = 10 << 30
    #: Let source downloads take proxies and CA bundles from the environment.
    source_trust_env: bool = True
    model_roots: Mapping[str, Path] = field(default_factory=dict)
    control_host: str = "0.0.0.0"
    control_port: int = 9443
    token_file: Path
    grace_seconds: float = 90.0
    #: `control.tls` (TLS_MODES); what it gives: `agent.ports.control_tls.control_certificate`.
    control_tls: str = "auto"
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 0
    gateway_host: str = "0.0.0.0"
    #: 0: no gateway.
    gateway_port: int = 0
    #: `gateway.grpcPort`, the gateway's gRPC front (`gateway.grpc_server`); 0: none.
    gateway_grpc_port: int = 0
    #: Longest a request's body may take once its headers arrived (408 after), and longest
    #: a connection may stay open without a complete request's headers (closed after): the
    #: control API's (`control.bodyTimeoutSeconds`, `idleTimeoutSeconds`) and the
    #: gateway's (`gateway.…`), as `ControlSettings` and `GatewaySettings` take them.
    control_body_timeout_seconds: float = 30.0
    control_idle_timeout_seconds: float = 75.0
    gateway_body_timeout_seconds: float = 60.0
    gateway_idle_timeout_seconds: float = 75.0
    #: `gateway.maxConnections`, `maxConnectionsPerAddress`, `reserveFileDescriptors`
    #: (`GatewaySettings`); None: derived from the open-files limit when the gateway starts.
    gateway_max_connections: int | None = None
    gateway_max_connections_per_address: int | None = None
    gateway_reserve_file_descriptors: int | None = None
    triton: TritonEndpoint
    policy: PolicyLoopSettings = PolicyLoopSettings()
    log_level: str = "info"
    json_logs: bool = True
    agent_version: str = "0.1.0"
    #: None: no heartbeat (local mode, tests without a cluster).
    kube: KubeAccess | None = None
    #: Local mode's dev loop (`dev.modelsFile`): the file naming the models a developer's
    #: own process serves (`engine.vouching.DevModels`); None: no dev loop (cluster mode
    #: always: refused there).
    dev_models_file: Path | None = None

    @property
    def socket_path(self) -> Path:
        """The engine's client socket (what models find in `modelswap.agent_socket`)."""
        return self.socket_dir / "agent.sock"

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.gpus)
