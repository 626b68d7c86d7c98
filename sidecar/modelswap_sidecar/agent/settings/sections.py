"""Reading the settings document's sections and values (`settings_from_document` puts them
together): each refusal is a SettingsError naming the key."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from modelswap_api.quantities import parse_bytes
from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.settings.values import TLS_MODES, CudaSettings, KubeAccess, SimGpu
from modelswap_sidecar.allocators.base import GRANULARITY_BYTES
from modelswap_sidecar.heartbeat.settings import DEFAULT_LEASE_NAMESPACE, HeartbeatSettings


def value_of(doc: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = doc.get(key, default)
    return default if value is None else value


def bytes_of(doc: Mapping[str, Any], key: str, default: int | None, where: str) -> int:
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


def path_of(doc: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> Path | None:
    value = doc.get(key)
    if value is None:
        if required:
            raise SettingsError(f"{where}{key} is required")
        return None
    return Path(str(value))


def required_path_of(doc: Mapping[str, Any], key: str, where: str) -> Path:
    value = path_of(doc, key, where)
    assert value is not None
    return value


def dev_models_file(doc: Any, *, local_mode: bool) -> Path | None:
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
    return required_path_of(doc, "modelsFile", "dev.")


def control_tls(control: Mapping[str, Any]) -> tuple[str, Path | None, Path | None]:
    """`control.tls` and the configured certificate files: both files or neither, and
    none with `tls: off`."""
    mode = str(value_of(control, "tls", "auto"))
    if mode not in TLS_MODES:
        raise SettingsError(f"control.tls: {mode!r} is not one of {', '.join(TLS_MODES)}")
    cert = path_of(control, "tlsCertFile", "control.", required=False)
    key = path_of(control, "tlsKeyFile", "control.", required=False)
    if (cert is None) != (key is None):
        missing = "tlsKeyFile" if key is None else "tlsCertFile"
        raise SettingsError(f"control.{missing} is required with the other TLS file")
    if mode == "off" and cert is not None:
        raise SettingsError("control.tlsCertFile: set, but control.tls is off")
    return mode, cert, key


def gpus_of(raw: Any, allocator: str, default_reserve_bytes: int = 0) -> tuple[SimGpu, ...]:
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
                uuid=str(value_of(g, "uuid", f"sim-gpu-{i}")),
                capacity_bytes=(
                    bytes_of(g, "capacityBytes", None, where)
                    if allocator == "sim" or (allocator == "auto" and "capacityBytes" in g)
                    else None
                ),
                reserve_bytes=(
                    bytes_of(g, "reserveBytes", 0, where)
                    if g.get("reserveBytes") is not None
                    else default_reserve_bytes
                ),
                link_gbps=positive(g, "linkGBps", where),
                pace_gbps=_pace(g, allocator, where),
            )
        )
    if len({g.uuid.lower() for g in gpus}) != len(gpus):
        raise SettingsError("gpus: uuids must be unique")
    return tuple(gpus)


def _pace(g: Mapping[str, Any], allocator: str, where: str) -> float | None:
    """`gpus[i].paceGBps`: positive, finite, and on a sim GPU (auto: an entry with
    `capacityBytes`, the sim fallback's)."""
    pace = positive(g, "paceGBps", where)
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


def cuda_of(doc: Any) -> CudaSettings:
    if doc is None:
        return CudaSettings()
    if not isinstance(doc, Mapping):
        raise SettingsError("cuda: expected a mapping")
    sizes = {}
    for key, default in (("chunkBytes", 256 << 20), ("maxChunkBytes", 1 << 30)):
        value = bytes_of(doc, key, default, "cuda.")
        if value <= 0 or value % GRANULARITY_BYTES:
            raise SettingsError(f"cuda.{key}: {value} is not a positive multiple of 2Mi")
        sizes[key] = value
    if sizes["chunkBytes"] > sizes["maxChunkBytes"]:
        raise SettingsError("cuda.chunkBytes: larger than cuda.maxChunkBytes")
    probe_bytes = bytes_of(doc, "linkProbeBytes", 256 << 20, "cuda.")
    if probe_bytes <= 0:
        raise SettingsError("cuda.linkProbeBytes: must be positive")
    return CudaSettings(
        chunk_bytes=sizes["chunkBytes"],
        max_chunk_bytes=sizes["maxChunkBytes"],
        link_probe=bool(value_of(doc, "linkProbe", True)),
        link_probe_bytes=probe_bytes,
        link_probe_timeout_seconds=positive(doc, "linkProbeTimeoutSeconds", "cuda.") or 60.0,
    )


#: Clients send a heartbeat every 5 s: a shorter deadline would end healthy processes.
MIN_UNRESPONSIVE_AFTER_SECONDS = 10.0


def unresponsive_after(policy: Mapping[str, Any]) -> float:
    """`policy.unresponsiveAfterSeconds`: 0 (never), or at least two heartbeat periods."""
    value = seconds_at_least_0(policy, "unresponsiveAfterSeconds", 20.0)
    if 0 < value < MIN_UNRESPONSIVE_AFTER_SECONDS:
        raise SettingsError(
            f"policy.unresponsiveAfterSeconds: {value:g} is shorter than "
            f"{MIN_UNRESPONSIVE_AFTER_SECONDS:g} s (model processes send a heartbeat every "
            "5 s); 0 turns it off"
        )
    return value


def seconds_at_least_0(policy: Mapping[str, Any], key: str, default: float) -> float:
    value = value_of(policy, key, default)
    try:
        seconds = float(value)
    except (TypeError, ValueError) as e:
        raise SettingsError(f"policy.{key}: not a number: {value!r}") from e
    if not seconds >= 0:  # NaN too
        raise SettingsError(f"policy.{key}: must be 0 or more, not {value!r}")
    return seconds


def positive(doc: Mapping[str, Any], key: str, where: str) -> float | None:
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


def count_of(doc: Mapping[str, Any], key: str, where: str) -> int | None:
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


def kube_of(doc: Any, node_name: str, *, local_mode: bool) -> KubeAccess | None:
    """The `kube` section: None when absent; refused in local mode (no cluster there)."""
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        raise SettingsError("kube: expected a mapping")
    if local_mode:
        raise SettingsError("kube: local mode has no cluster (no SwapNode, no Lease)")
    kubeconfig = path_of(doc, "kubeconfig", "kube.", required=False)
    in_cluster = bool(value_of(doc, "inCluster", False))
    if (kubeconfig is None) == (not in_cluster):
        raise SettingsError("kube: set exactly one of kubeconfig and inCluster: true")
    try:
        heartbeat = HeartbeatSettings(
            node_name=node_name,
            lease_namespace=str(value_of(doc, "leaseNamespace", DEFAULT_LEASE_NAMESPACE)),
            holder_identity=value_of(doc, "holderIdentity"),
            lease_duration_seconds=int(value_of(doc, "leaseDurationSeconds", 20)),
            renew_interval_seconds=float(value_of(doc, "renewIntervalSeconds", 5.0)),
            status_interval_seconds=float(value_of(doc, "statusIntervalSeconds", 10.0)),
            min_status_write_interval_seconds=float(
                value_of(doc, "minStatusWriteIntervalSeconds", 1.0)
            ),
            node_refresh_seconds=float(value_of(doc, "nodeRefreshSeconds", 60.0)),
        )
    except (TypeError, ValueError) as e:
        message = str(e)
        for snake, camel in _HEARTBEAT_KEYS.items():
            message = message.replace(snake, camel)
        raise SettingsError(f"kube.{message}") from e
    advertise = value_of(doc, "advertiseHost")
    return KubeAccess(
        kubeconfig=kubeconfig,
        advertise_host=str(advertise) if advertise else None,
        heartbeat=heartbeat,
    )
