"""The agent's settings: read once at start (a YAML file, then command-line overrides) into
frozen dataclasses that are passed down. Nothing here reads the environment.

    nodeName: node-a
    localMode: false                # true: no fencing (no operator, no Lease)
    allocator: sim                  # sim | cuda-vmm | auto (cuda-vmm when a capable GPU is
                                    # present, else sim)
    gpus:                           # sim: one entry per simulated GPU (capacityBytes needed);
                                    # cuda-vmm: optional, the GPUs to manage by UUID and their
                                    # reserves (none: every capable GPU, HBM totals from NVML)
      - {uuid: sim-gpu-0, capacityBytes: 128Mi, reserveBytes: 0,
         linkGBps: null,            # sim link speed reported; null: paceGBps, else measured
         paceGBps: null}            # sim: every model's copies paced to this emulated link
                                    # (told at registration); null: unpaced. Refused on cuda
    gpuReserveBytes: 0              # HBM kept back on every GPU without its own
                                    # gpus[].reserveBytes (a chart cannot know GPU UUIDs)
    poolChunkBytes: 32Mi            # sim
    cuda: {chunkBytes: 256Mi, maxChunkBytes: 1Gi,          # cuda-vmm only
           linkProbe: true, linkProbeBytes: 256Mi, linkProbeTimeoutSeconds: 60}
    overheadBytesPerProcess: 0
    hostStore: {dir: /var/lib/modelswap/store, capacityBytes: 4Gi}     # per GPU
    socketDir: /run/modelswap
    stateDir: /var/lib/modelswap/agent
    sourceCache: {dir: /var/cache/modelswap, capacityBytes: 20Gi, maxDownloadBytes: 10Gi,
                  trustEnv: true}
    modelRoots: {/models: /srv/models}   # mounted-source prefix -> where it is on this host
    control: {host: 0.0.0.0, port: 9443, tokenFile: /etc/modelswap/token, graceSeconds: 90,
              tls: auto,            # auto | off. auto: HTTPS with tlsCertFile/tlsKeyFile
                                    # when set, else (cluster mode, a `kube` section) with a
                                    # key and self-signed certificate made at start; plain
                                    # HTTP without either (local mode). off: plain HTTP.
              tlsCertFile: null, tlsKeyFile: null,   # the certificate is published in
                                    # the SwapNode (status.certificate), the operator pins it
              bodyTimeoutSeconds: 30, idleTimeoutSeconds: 75}
    metrics: {host: 0.0.0.0, port: 9090}     # port 0: no metrics server
    gateway: {host: 0.0.0.0, port: 8080,     # KServe v2 + OpenAI; port 0: no gateway
              grpcPort: 8081,                # Triton's gRPC API (needs triton.grpcUrl);
                                             # 0 or absent: no gRPC front
              bodyTimeoutSeconds: 60, idleTimeoutSeconds: 75,
              maxConnections: null,          # client connections at most; null: the
                                             # open-files limit less the reserve
              maxConnectionsPerAddress: null,  # null: a quarter of maxConnections
              reserveFileDescriptors: null}  # fds left to the rest of the agent; null: a
                                             # quarter of the limit, 1024 to half of it
    triton: {url: 127.0.0.1:8000, repository: /var/lib/modelswap/repository,
             grpcUrl: 127.0.0.1:8001,        # Triton's gRPC port (the gRPC front's)
             pidFile: null, supervisorStateFile: null, loadTimeoutSeconds: 600}
    policy: {intervalSeconds: 0.5, highWatermarkFraction: 0.95, lowWatermarkFraction: 0.85,
             retryFailedSeconds: 60, drainTimeoutSeconds: 60,
             unresponsiveAfterSeconds: 20}  # a model process with no heartbeat this long
                                            # is killed and reloaded; 0: never
    # no policy defaults: each desired entry carries its effective policy (a `defaults`
    # key from an older config is ignored)
    kube:                           # cluster mode: SwapNode + node Lease (omit: none)
      kubeconfig: null              # a path, or inCluster: true (the service account)
      inCluster: false
      leaseNamespace: modelswap-node-leases
      holderIdentity: null          # the Lease's holder (e.g. the pod name); default nodeName
      advertiseHost: null           # the address in the SwapNode's endpoints (the pod IP)
      leaseDurationSeconds: 20
      renewIntervalSeconds: 5
      statusIntervalSeconds: 10
      minStatusWriteIntervalSeconds: 1
      nodeRefreshSeconds: 60
    dev:                            # local mode only (refused otherwise): the dev loop
      modelsFile: null              # JSON {"models": [engine names]} local mode writes: a
                                    # process of the agent's uid outside Triton may attach
                                    # as one of them, and none is loaded into Triton
    logLevel: info
    jsonLogs: true
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modelswap_api.quantities import parse_bytes
from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.allocators.base import GRANULARITY_BYTES
from modelswap_sidecar.heartbeat.settings import DEFAULT_LEASE_NAMESPACE, HeartbeatSettings

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


def _get(doc: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = doc.get(key, default)
    return default if value is None else value


def _bytes(doc: Mapping[str, Any], key: str, default: int | None, where: str) -> int:
    value = doc.get(key)
    if value is None:
        if default is None:
            raise SettingsError(f"{where}{key} is required")
        return default
    if value == 0 and default == 0:
        return 0
    try:
        return parse_bytes(value)
    except ValueError as e:
        raise SettingsError(f"{where}{key}: {e}") from e


def _path(doc: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> Path | None:
    value = doc.get(key)
    if value is None:
        if required:
            raise SettingsError(f"{where}{key} is required")
        return None
    return Path(str(value))


def _required_path(doc: Mapping[str, Any], key: str, where: str) -> Path:
    value = _path(doc, key, where)
    assert value is not None
    return value


def settings_from_document(doc: Mapping[str, Any]) -> AgentSettings:
    """Settings from a decoded YAML document (camelCase keys); SettingsError naming the key."""
    node_name = doc.get("nodeName")
    if not node_name:
        raise SettingsError("nodeName is required")
    allocator = str(_get(doc, "allocator", "sim"))
    if allocator not in ALLOCATORS:
        raise SettingsError(f"allocator: {allocator!r} is not one of {', '.join(ALLOCATORS)}")
    gpu_reserve_bytes = _bytes(doc, "gpuReserveBytes", 0, "")
    gpus = _gpus(doc.get("gpus"), allocator, gpu_reserve_bytes)
    store = _get(doc, "hostStore", {})
    cache = _get(doc, "sourceCache", {})
    control = _get(doc, "control", {})
    metrics = _get(doc, "metrics", {})
    gateway = _get(doc, "gateway", {})
    triton = _get(doc, "triton", {})
    policy = _get(doc, "policy", {})
    if not triton.get("url"):
        raise SettingsError("triton.url is required")
    if int(_get(gateway, "grpcPort", 0) or 0) and not triton.get("grpcUrl"):
        raise SettingsError("gateway.grpcPort needs triton.grpcUrl (Triton's gRPC host:port)")
    local_mode = bool(_get(doc, "localMode", False))
    tls_mode, tls_cert_file, tls_key_file = _control_tls(control)
    max_connections = _count(gateway, "maxConnections", "gateway.")
    max_per_address = _count(gateway, "maxConnectionsPerAddress", "gateway.")
    if (
        max_connections is not None
        and max_per_address is not None
        and max_per_address > max_connections
    ):
        raise SettingsError(
            f"gateway.maxConnectionsPerAddress: {max_per_address} is more than "
            f"gateway.maxConnections ({max_connections})"
        )
    return AgentSettings(
        node_name=str(node_name),
        local_mode=local_mode,
        allocator=allocator,
        gpus=gpus,
        gpu_reserve_bytes=gpu_reserve_bytes,
        pool_chunk_bytes=_bytes(doc, "poolChunkBytes", 32 << 20, ""),
        cuda=_cuda(doc.get("cuda")),
        overhead_bytes_per_process=_bytes(doc, "overheadBytesPerProcess", 0, ""),
        host_store_dir=_required_path(store, "dir", "hostStore."),
        host_store_capacity_bytes=_bytes(store, "capacityBytes", 4 << 30, "hostStore."),
        socket_dir=_required_path(doc, "socketDir", ""),
        state_dir=_required_path(doc, "stateDir", ""),
        source_cache_dir=_required_path(cache, "dir", "sourceCache."),
        source_cache_capacity_bytes=_bytes(cache, "capacityBytes", 20 << 30, "sourceCache."),
        source_max_download_bytes=_bytes(cache, "maxDownloadBytes", 10 << 30, "sourceCache."),
        source_trust_env=bool(_get(cache, "trustEnv", True)),
        model_roots={str(k): Path(str(v)) for k, v in _get(doc, "modelRoots", {}).items()},
        control_host=str(_get(control, "host", "0.0.0.0")),
        control_port=int(_get(control, "port", 9443)),
        token_file=_required_path(control, "tokenFile", "control."),
        grace_seconds=float(_get(control, "graceSeconds", 90.0)),
        control_tls=tls_mode,
        tls_cert_file=tls_cert_file,
        tls_key_file=tls_key_file,
        metrics_host=str(_get(metrics, "host", "0.0.0.0")),
        metrics_port=int(_get(metrics, "port", 0)),
        gateway_host=str(_get(gateway, "host", "0.0.0.0")),
        gateway_port=int(_get(gateway, "port", 0)),
        gateway_grpc_port=int(_get(gateway, "grpcPort", 0) or 0),
        control_body_timeout_seconds=_positive(control, "bodyTimeoutSeconds", "control.") or 30.0,
        control_idle_timeout_seconds=_positive(control, "idleTimeoutSeconds", "control.") or 75.0,
        gateway_body_timeout_seconds=_positive(gateway, "bodyTimeoutSeconds", "gateway.") or 60.0,
        gateway_idle_timeout_seconds=_positive(gateway, "idleTimeoutSeconds", "gateway.") or 75.0,
        gateway_max_connections=max_connections,
        gateway_max_connections_per_address=max_per_address,
        gateway_reserve_file_descriptors=_count(gateway, "reserveFileDescriptors", "gateway."),
        triton=TritonEndpoint(
            url=str(triton["url"]),
            grpc_url=str(triton["grpcUrl"]) if triton.get("grpcUrl") else None,
            repository=_required_path(triton, "repository", "triton."),
            pid_file=_path(triton, "pidFile", "triton.", required=False),
            supervisor_state_file=_path(triton, "supervisorStateFile", "triton.", required=False),
            load_timeout_seconds=float(_get(triton, "loadTimeoutSeconds", 600.0)),
            request_timeout_seconds=float(_get(triton, "requestTimeoutSeconds", 10.0)),
        ),
        policy=PolicyLoopSettings(
            interval_seconds=float(_get(policy, "intervalSeconds", 0.5)),
            high_watermark_fraction=float(_get(policy, "highWatermarkFraction", 0.95)),
            low_watermark_fraction=float(_get(policy, "lowWatermarkFraction", 0.85)),
            retry_failed_seconds=float(_get(policy, "retryFailedSeconds", 60.0)),
            drain_timeout_seconds=float(_get(policy, "drainTimeoutSeconds", 60.0)),
            busy_victim_wait_seconds=_seconds_at_least_0(policy, "busyVictimWaitSeconds", 10.0),
            unresponsive_after_seconds=_unresponsive_after(policy),
        ),
        log_level=str(_get(doc, "logLevel", "info")),
        json_logs=bool(_get(doc, "jsonLogs", True)),
        kube=_kube(doc.get("kube"), str(node_name), local_mode=local_mode),
        dev_models_file=_dev(doc.get("dev"), local_mode=local_mode),
    )


def _dev(doc: Any, *, local_mode: bool) -> Path | None:
    """The `dev` section's models file: refused unless `localMode: true` (a cluster node
    vouches only for its runtime's processes), and local mode has no `kube` section."""
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        raise SettingsError("dev: expected a mapping")
    if not local_mode:
        raise SettingsError(
            "dev: the dev loop (a developer's own process attaching as a model) exists in "
            "local mode only (`modelswap up --dev`); a cluster node never takes it"
        )
    return _required_path(doc, "modelsFile", "dev.")


def _control_tls(control: Mapping[str, Any]) -> tuple[str, Path | None, Path | None]:
    """`control.tls` and the configured certificate files: both files or neither, and
    none with `tls: off`."""
    mode = str(_get(control, "tls", "auto"))
    if mode not in TLS_MODES:
        raise SettingsError(f"control.tls: {mode!r} is not one of {', '.join(TLS_MODES)}")
    cert = _path(control, "tlsCertFile", "control.", required=False)
    key = _path(control, "tlsKeyFile", "control.", required=False)
    if (cert is None) != (key is None):
        missing = "tlsKeyFile" if key is None else "tlsCertFile"
        raise SettingsError(f"control.{missing} is required with the other TLS file")
    if mode == "off" and cert is not None:
        raise SettingsError("control.tlsCertFile: set, but control.tls is off")
    return mode, cert, key


def _gpus(raw: Any, allocator: str, default_reserve_bytes: int = 0) -> tuple[SimGpu, ...]:
    """The `gpus` list. sim: at least one, each with `capacityBytes`. cuda-vmm: optional
    (which GPUs to manage, by UUID, and their reserves); `capacityBytes`/`linkGBps` are sim
    figures and refused there. auto: either; `capacityBytes` is checked when auto falls back
    to sim (`gpu_setup`)."""
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise SettingsError("gpus: expected a list")
    if not raw and allocator == "sim":
        raise SettingsError("gpus: at least one GPU is required")
    gpus = []
    for i, g in enumerate(raw):
        where = f"gpus[{i}]."
        if not isinstance(g, Mapping):
            raise SettingsError(f"gpus[{i}]: expected a mapping")
        if allocator == "cuda-vmm":
            for key in ("capacityBytes", "linkGBps"):
                if g.get(key) is not None:
                    raise SettingsError(
                        f"{where}{key}: a sim figure; cuda-vmm reads HBM from NVML "
                        "and measures the link"
                    )
            if g.get("paceGBps") is not None:
                raise SettingsError(
                    f"{where}paceGBps: copy pacing emulates a link on sim GPUs only; "
                    "cuda-vmm copies over the real one"
                )
            if not g.get("uuid"):
                raise SettingsError(f"{where}uuid is required with allocator cuda-vmm")
        gpus.append(
            SimGpu(
                uuid=str(_get(g, "uuid", f"sim-gpu-{i}")),
                capacity_bytes=(
                    _bytes(g, "capacityBytes", None, where)
                    if allocator == "sim" or (allocator == "auto" and "capacityBytes" in g)
                    else None
                ),
                reserve_bytes=(
                    _bytes(g, "reserveBytes", 0, where)
                    if g.get("reserveBytes") is not None
                    else default_reserve_bytes
                ),
                link_gbps=_positive(g, "linkGBps", where),
                pace_gbps=_pace(g, allocator, where),
            )
        )
    if len({g.uuid.lower() for g in gpus}) != len(gpus):
        raise SettingsError("gpus: uuids must be unique")
    return tuple(gpus)


def _pace(g: Mapping[str, Any], allocator: str, where: str) -> float | None:
    """`gpus[i].paceGBps`: positive, finite, and on a sim GPU (auto: an entry with
    `capacityBytes`, the sim fallback's)."""
    pace = _positive(g, "paceGBps", where)
    if pace is None:
        return None
    if not math.isfinite(pace):
        raise SettingsError(f"{where}paceGBps: must be finite")
    if allocator == "auto" and g.get("capacityBytes") is None:
        raise SettingsError(
            f"{where}paceGBps: copy pacing emulates a link on sim GPUs only; this entry "
            "has no capacityBytes, so it selects a CUDA GPU"
        )
    return pace


def _cuda(doc: Any) -> CudaSettings:
    if doc is None:
        return CudaSettings()
    if not isinstance(doc, Mapping):
        raise SettingsError("cuda: expected a mapping")
    sizes = {}
    for key, default in (("chunkBytes", 256 << 20), ("maxChunkBytes", 1 << 30)):
        value = _bytes(doc, key, default, "cuda.")
        if value <= 0 or value % GRANULARITY_BYTES:
            raise SettingsError(f"cuda.{key}: {value} is not a positive multiple of 2Mi")
        sizes[key] = value
    if sizes["chunkBytes"] > sizes["maxChunkBytes"]:
        raise SettingsError("cuda.chunkBytes: larger than cuda.maxChunkBytes")
    probe_bytes = _bytes(doc, "linkProbeBytes", 256 << 20, "cuda.")
    if probe_bytes <= 0:
        raise SettingsError("cuda.linkProbeBytes: must be positive")
    return CudaSettings(
        chunk_bytes=sizes["chunkBytes"],
        max_chunk_bytes=sizes["maxChunkBytes"],
        link_probe=bool(_get(doc, "linkProbe", True)),
        link_probe_bytes=probe_bytes,
        link_probe_timeout_seconds=_positive(doc, "linkProbeTimeoutSeconds", "cuda.") or 60.0,
    )


#: Clients send a heartbeat every 5 s: a shorter deadline would end healthy processes.
MIN_UNRESPONSIVE_AFTER_SECONDS = 10.0


def _unresponsive_after(policy: Mapping[str, Any]) -> float:
    """`policy.unresponsiveAfterSeconds`: 0 (never), or at least two heartbeat periods."""
    value = _seconds_at_least_0(policy, "unresponsiveAfterSeconds", 20.0)
    if 0 < value < MIN_UNRESPONSIVE_AFTER_SECONDS:
        raise SettingsError(
            f"policy.unresponsiveAfterSeconds: {value:g} is shorter than "
            f"{MIN_UNRESPONSIVE_AFTER_SECONDS:g} s (model processes send a heartbeat every "
            "5 s); 0 turns it off"
        )
    return value


def _seconds_at_least_0(policy: Mapping[str, Any], key: str, default: float) -> float:
    value = _get(policy, key, default)
    try:
        seconds = float(value)
    except (TypeError, ValueError) as e:
        raise SettingsError(f"policy.{key}: not a number: {value!r}") from e
    if not seconds >= 0:  # NaN too
        raise SettingsError(f"policy.{key}: must be 0 or more, not {value!r}")
    return seconds


def _positive(doc: Mapping[str, Any], key: str, where: str) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError) as e:
        raise SettingsError(f"{where}{key}: not a number: {value!r}") from e
    if number <= 0:
        raise SettingsError(f"{where}{key}: must be positive")
    return number


def _count(doc: Mapping[str, Any], key: str, where: str) -> int | None:
    """A whole number of at least 1 (connections, file descriptors); None when unset."""
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"{where}{key}: not a whole number: {value!r}")
    if value < 1:
        raise SettingsError(f"{where}{key}: must be at least 1, not {value}")
    return value


_HEARTBEAT_KEYS = {
    "lease_duration_seconds": "leaseDurationSeconds",
    "renew_interval_seconds": "renewIntervalSeconds",
    "min_status_write_interval_seconds": "minStatusWriteIntervalSeconds",
    "status_interval_seconds": "statusIntervalSeconds",
    "node_refresh_seconds": "nodeRefreshSeconds",
}


def _kube(doc: Any, node_name: str, *, local_mode: bool) -> KubeAccess | None:
    """The `kube` section: None when absent; refused in local mode (no cluster there)."""
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        raise SettingsError("kube: expected a mapping")
    if local_mode:
        raise SettingsError("kube: local mode has no cluster (no SwapNode, no Lease)")
    kubeconfig = _path(doc, "kubeconfig", "kube.", required=False)
    in_cluster = bool(_get(doc, "inCluster", False))
    if (kubeconfig is None) == (not in_cluster):
        raise SettingsError("kube: set exactly one of kubeconfig and inCluster: true")
    try:
        heartbeat = HeartbeatSettings(
            node_name=node_name,
            lease_namespace=str(_get(doc, "leaseNamespace", DEFAULT_LEASE_NAMESPACE)),
            holder_identity=_get(doc, "holderIdentity"),
            lease_duration_seconds=int(_get(doc, "leaseDurationSeconds", 20)),
            renew_interval_seconds=float(_get(doc, "renewIntervalSeconds", 5.0)),
            status_interval_seconds=float(_get(doc, "statusIntervalSeconds", 10.0)),
            min_status_write_interval_seconds=float(
                _get(doc, "minStatusWriteIntervalSeconds", 1.0)
            ),
            node_refresh_seconds=float(_get(doc, "nodeRefreshSeconds", 60.0)),
        )
    except (TypeError, ValueError) as e:
        message = str(e)
        for snake, camel in _HEARTBEAT_KEYS.items():
            message = message.replace(snake, camel)
        raise SettingsError(f"kube.{message}") from e
    advertise = _get(doc, "advertiseHost")
    return KubeAccess(
        kubeconfig=kubeconfig,
        advertise_host=str(advertise) if advertise else None,
        heartbeat=heartbeat,
    )


def load_settings(path: Path | None, overrides: Mapping[str, Any]) -> AgentSettings:
    """Settings from the YAML file at `path` (if any) with `overrides` (dotted camelCase
    keys, e.g. `control.port`) applied on top."""
    doc: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as e:
            raise SettingsError(f"{path}: {e}") from e
        if loaded is not None and not isinstance(loaded, dict):
            raise SettingsError(f"{path}: expected a mapping at the top")
        doc = loaded or {}
    for dotted, value in overrides.items():
        if value is None:
            continue
        if dotted.startswith("kube.") and doc.get("kube") is None:
            # A flag must not conjure a cluster section (and a heartbeat) out of nothing.
            raise SettingsError(f"{dotted}: given, but the settings have no kube section")
        target = doc
        *parents, last = dotted.split(".")
        for key in parents:
            target = target.setdefault(key, {})
        target[last] = value
    return settings_from_document(doc)
