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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.settings.sections import (
    bytes_of,
    control_tls,
    count_of,
    cuda_of,
    dev_models_file,
    gpus_of,
    kube_of,
    path_of,
    positive,
    required_path_of,
    seconds_at_least_0,
    unresponsive_after,
    value_of,
)
from modelswap_sidecar.agent.settings.values import (
    ALLOCATORS,
    AgentSettings,
    PolicyLoopSettings,
    TritonEndpoint,
)


def settings_from_document(doc: Mapping[str, Any]) -> AgentSettings:
    """Settings from a decoded YAML document (camelCase keys); SettingsError naming the key."""
    node_name = doc.get("nodeName")
    if not node_name:
        raise SettingsError("nodeName is required")
    allocator = str(value_of(doc, "allocator", "sim"))
    if allocator not in ALLOCATORS:
        raise SettingsError(f"allocator: {allocator!r} is not one of {', '.join(ALLOCATORS)}")
    gpu_reserve_bytes = bytes_of(doc, "gpuReserveBytes", 0, "")
    gpus = gpus_of(doc.get("gpus"), allocator, gpu_reserve_bytes)
    store = value_of(doc, "hostStore", {})
    cache = value_of(doc, "sourceCache", {})
    control = value_of(doc, "control", {})
    metrics = value_of(doc, "metrics", {})
    gateway = value_of(doc, "gateway", {})
    triton = value_of(doc, "triton", {})
    policy = value_of(doc, "policy", {})
    if not triton.get("url"):
        raise SettingsError("triton.url is required")
    if int(value_of(gateway, "grpcPort", 0) or 0) and not triton.get("grpcUrl"):
        raise SettingsError("gateway.grpcPort needs triton.grpcUrl (Triton's gRPC host:port)")
    local_mode = bool(value_of(doc, "localMode", False))
    tls_mode, tls_cert_file, tls_key_file = control_tls(control)
    max_connections = count_of(gateway, "maxConnections", "gateway.")
    max_per_address = count_of(gateway, "maxConnectionsPerAddress", "gateway.")
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
        pool_chunk_bytes=bytes_of(doc, "poolChunkBytes", 32 << 20, ""),
        cuda=cuda_of(doc.get("cuda")),
        overhead_bytes_per_process=bytes_of(doc, "overheadBytesPerProcess", 0, ""),
        host_store_dir=required_path_of(store, "dir", "hostStore."),
        host_store_capacity_bytes=bytes_of(store, "capacityBytes", 4 << 30, "hostStore."),
        socket_dir=required_path_of(doc, "socketDir", ""),
        state_dir=required_path_of(doc, "stateDir", ""),
        source_cache_dir=required_path_of(cache, "dir", "sourceCache."),
        source_cache_capacity_bytes=bytes_of(cache, "capacityBytes", 20 << 30, "sourceCache."),
        source_max_download_bytes=bytes_of(cache, "maxDownloadBytes", 10 << 30, "sourceCache."),
        source_trust_env=bool(value_of(cache, "trustEnv", True)),
        model_roots={str(k): Path(str(v)) for k, v in value_of(doc, "modelRoots", {}).items()},
        control_host=str(value_of(control, "host", "0.0.0.0")),
        control_port=int(value_of(control, "port", 9443)),
        token_file=required_path_of(control, "tokenFile", "control."),
        grace_seconds=float(value_of(control, "graceSeconds", 90.0)),
        control_tls=tls_mode,
        tls_cert_file=tls_cert_file,
        tls_key_file=tls_key_file,
        metrics_host=str(value_of(metrics, "host", "0.0.0.0")),
        metrics_port=int(value_of(metrics, "port", 0)),
        gateway_host=str(value_of(gateway, "host", "0.0.0.0")),
        gateway_port=int(value_of(gateway, "port", 0)),
        gateway_grpc_port=int(value_of(gateway, "grpcPort", 0) or 0),
        control_body_timeout_seconds=positive(control, "bodyTimeoutSeconds", "control.") or 30.0,
        control_idle_timeout_seconds=positive(control, "idleTimeoutSeconds", "control.") or 75.0,
        gateway_body_timeout_seconds=positive(gateway, "bodyTimeoutSeconds", "gateway.") or 60.0,
        gateway_idle_timeout_seconds=positive(gateway, "idleTimeoutSeconds", "gateway.") or 75.0,
        gateway_max_connections=max_connections,
        gateway_max_connections_per_address=max_per_address,
        gateway_reserve_file_descriptors=count_of(gateway, "reserveFileDescriptors", "gateway."),
        triton=TritonEndpoint(
            url=str(triton["url"]),
            grpc_url=str(triton["grpcUrl"]) if triton.get("grpcUrl") else None,
            repository=required_path_of(triton, "repository", "triton."),
            pid_file=path_of(triton, "pidFile", "triton.", required=False),
            supervisor_state_file=path_of(triton, "supervisorStateFile", "triton.", required=False),
            load_timeout_seconds=float(value_of(triton, "loadTimeoutSeconds", 600.0)),
            request_timeout_seconds=float(value_of(triton, "requestTimeoutSeconds", 10.0)),
        ),
        policy=PolicyLoopSettings(
            interval_seconds=float(value_of(policy, "intervalSeconds", 0.5)),
            high_watermark_fraction=float(value_of(policy, "highWatermarkFraction", 0.95)),
            low_watermark_fraction=float(value_of(policy, "lowWatermarkFraction", 0.85)),
            retry_failed_seconds=float(value_of(policy, "retryFailedSeconds", 60.0)),
            drain_timeout_seconds=float(value_of(policy, "drainTimeoutSeconds", 60.0)),
            busy_victim_wait_seconds=seconds_at_least_0(policy, "busyVictimWaitSeconds", 10.0),
            unresponsive_after_seconds=unresponsive_after(policy),
        ),
        log_level=str(value_of(doc, "logLevel", "info")),
        json_logs=bool(value_of(doc, "jsonLogs", True)),
        kube=kube_of(doc.get("kube"), str(node_name), local_mode=local_mode),
        dev_models_file=dev_models_file(doc.get("dev"), local_mode=local_mode),
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
