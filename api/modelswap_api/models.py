"""Typed models of ModelDeployment and SwapNode (frozen dataclasses, camelCase on the wire).

Build them from validated dicts (`modelswap_api.resources.validate_resource`) with
`ModelDeployment.from_dict`; quantities and durations keep the text as written (round
trips are exact) and expose `.bytes` / `.seconds`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from modelswap_api import codec
from modelswap_api.crds import API_VERSION
from modelswap_api.quantities import Duration, Quantity

Phase = Literal[
    "Pending", "Placed", "Loading", "Resident", "SwappingOut", "SwappedOut",
    "SwappingIn", "Dropped", "Failed", "Deleting",
]  # fmt: skip
#: A ModelDeployment's phase: a node's phase for the model, or `Unknown` while the node
#: that holds it cannot vouch for it (its Lease is stale, or its agent cannot be reached).
DeploymentPhase = Literal[Phase, "Unknown"]
OnSwapOut = Literal["host", "drop"]
KvMode = Literal["discard", "preserve"]


class _Wire:
    """Mixin: `from_dict` / `to_dict` through the codec."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        return codec.from_dict(cls, data)

    def to_dict(self) -> dict[str, Any]:
        return codec.to_dict(self)


@dataclass(frozen=True, kw_only=True)
class SecretRef(_Wire):
    name: str


@dataclass(frozen=True, kw_only=True)
class Source(_Wire):
    uri: str
    sha256: str | None = None
    credentials_secret_ref: SecretRef | None = None

    @property
    def is_url(self) -> bool:
        return self.uri.startswith(("http://", "https://"))


@dataclass(frozen=True, kw_only=True)
class ModelSpec(_Wire):
    name: str | None = None
    runtime: Literal["triton"] | None = None
    source: Source
    weights_bytes: Quantity
    kv_cache_bytes: Quantity | None = None


@dataclass(frozen=True, kw_only=True)
class GpuSelector(_Wire):
    product: str | None = None
    min_hbm_bytes: Quantity | None = None


@dataclass(frozen=True, kw_only=True)
class Toleration(_Wire):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


@dataclass(frozen=True, kw_only=True)
class Placement(_Wire):
    node_selector: Mapping[str, str] | None = None
    gpu_selector: GpuSelector | None = None
    tolerations: tuple[Toleration, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class SwapPolicy(_Wire):
    """Every field optional: unset ones take the cluster defaults (`effective_policy`)."""

    idle_after: Duration | None = None
    min_resident: Duration | None = None
    priority: int | None = None
    pinned: bool | None = None
    on_swap_out: OnSwapOut | None = None
    kv: KvMode | None = None


@dataclass(frozen=True, kw_only=True)
class KvCachePolicy(_Wire):
    offload_after_tokens: int | None = None
    host_bytes: Quantity | None = None


@dataclass(frozen=True, kw_only=True)
class BatchShapingPolicy(_Wire):
    """`spec.gateway.batchShaping`: prompt-length buckets (UTF-8 bytes) and the longest
    wait in one; off while `max_wait_milliseconds` is 0."""

    max_wait_milliseconds: int
    prompt_bytes_edges: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class GatewayPolicy(_Wire):
    max_queued: int | None = None
    queue_timeout: Duration | None = None
    max_tokens: int | None = None
    max_prompt_bytes: Quantity | None = None
    batch_shaping: BatchShapingPolicy | None = None


@dataclass(frozen=True, kw_only=True)
class ModelDeploymentSpec(_Wire):
    model: ModelSpec
    placement: Placement | None = None
    swap_policy: SwapPolicy | None = None
    kv_cache: KvCachePolicy | None = None
    gateway: GatewayPolicy | None = None


@dataclass(frozen=True, kw_only=True)
class Condition(_Wire):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None
    observed_generation: int | None = None


@dataclass(frozen=True, kw_only=True)
class EffectivePolicyStatus(_Wire):
    """`status.effectivePolicy`: the merged policy, quantities in bytes."""

    idle_after: str | None = None
    min_resident: str | None = None
    priority: int | None = None
    pinned: bool | None = None
    on_swap_out: str | None = None
    kv: str | None = None
    offload_after_tokens: int | None = None
    kv_host_bytes: int | None = None
    max_queued: int | None = None
    queue_timeout: str | None = None
    max_tokens: int | None = None
    max_prompt_bytes: int | None = None
    batch_shaping: BatchShapingPolicy | None = None


@dataclass(frozen=True, kw_only=True)
class KvBytesStatus(_Wire):
    """`status.kv`: the KV-cache bytes the model's conversations hold now, per tier, each
    with its `Size` twin, and `shown` (`"<gpu>/<host>"` sizes) for the wide KV column."""

    gpu_bytes: int | None = None
    gpu_size: str | None = None
    host_bytes: int | None = None
    host_size: str | None = None
    shown: str | None = None


@dataclass(frozen=True, kw_only=True)
class ModelDeploymentStatus(_Wire):
    phase: DeploymentPhase | None = None
    #: The name users call the model by (spec.model.name, else metadata.name).
    model_name: str | None = None
    node: str | None = None
    gpu: str | None = None
    endpoint: str | None = None
    resident_bytes: int | None = None
    #: `resident_bytes` for people (`quantities.format_bytes`): the RESIDENT column.
    resident_size: str | None = None
    host_bytes: int | None = None
    #: `host_bytes` for people: the HOST column.
    host_size: str | None = None
    #: KV-cache bytes per tier (the KV column, `-o wide`).
    kv: KvBytesStatus | None = None
    last_request_time: str | None = None
    #: Swap-ins and swap-outs over the model's life, on every node that hosted it.
    swap_ins: int | None = None
    swap_outs: int | None = None
    #: The part of `swap_ins`/`swap_outs` counted on nodes that no longer host the model
    #: (or before its agent restarted): added when the model left them.
    earlier_swap_ins: int | None = None
    earlier_swap_outs: int | None = None
    last_swap_in_seconds: float | None = None
    effective_policy: EffectivePolicyStatus | None = None
    observed_generation: int | None = None
    #: The generation at which `spec.model` last changed: the model generation that
    #: should serve (`modelswap_operator.model_generations`), and the digest of the
    #: `spec.model` fields it was decided from.
    model_generation: int | None = None
    model_digest: str | None = None
    #: The model generation its node serves (while a changed model rolls out, the old one
    #: until the new one answers); unset while none serves.
    serving_model_generation: int | None = None
    conditions: tuple[Condition, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class ModelDeployment(_Wire):
    api_version: str = API_VERSION
    kind: str = "ModelDeployment"
    metadata: Mapping[str, Any] = field(default_factory=dict)
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus | None = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))

    @property
    def model_name(self) -> str:
        """The name users call the model by: spec.model.name, else metadata.name."""
        return self.spec.model.name or self.name

    def with_status(self, status: ModelDeploymentStatus) -> ModelDeployment:
        return dataclasses.replace(self, status=status)


@dataclass(frozen=True, kw_only=True)
class Link(_Wire):
    kind: Literal["pcie", "c2c", "sim"] | None = None
    host_to_device_gbps: float | None = field(default=None, metadata={"wire": "hostToDeviceGBps"})
    device_to_host_gbps: float | None = field(default=None, metadata={"wire": "deviceToHostGBps"})


@dataclass(frozen=True, kw_only=True)
class GpuStatus(_Wire):
    uuid: str
    ordinal: int
    product: str | None = None
    hbm_total_bytes: int | None = None
    hbm_reserved_bytes: int | None = None
    per_process_overhead_bytes: int | None = None
    hbm_free_bytes: int | None = None
    host_store_bytes: int | None = None
    host_store_capacity_bytes: int | None = None
    link: Link | None = None


@dataclass(frozen=True, kw_only=True)
class Taint(_Wire):
    key: str
    effect: str
    value: str | None = None


@dataclass(frozen=True, kw_only=True)
class HostedModel(_Wire):
    """One model a node's agent holds, as its SwapNode reports it: what the operator copies
    into the ModelDeployment's status without asking the agent."""

    uid: str
    namespace: str | None = None
    name: str | None = None
    state: str | None = None
    gpu: str | None = None
    resident_bytes: int | None = None
    #: The desired entry's generation the agent holds (the ModelDeployment's
    #: metadata.generation when the operator sent it).
    generation: int | None = None
    #: The model generation of the instance reported: the one that serves, or loads
    #: (`agent.core.instances`).
    model_generation: int | None = None
    #: While a changed model rolls out: `RollingOut`, `RolloutInterrupts` or
    #: `RolloutFailed`, the model generation rolled out to, and the message for people.
    rollout_reason: str | None = None
    rollout_model_generation: int | None = None
    rollout_message: str | None = None
    #: False once dropped from the desired set while its host-store bytes are kept.
    desired: bool | None = None
    host_bytes: int | None = None
    #: KV-cache bytes its conversations hold in GPU memory and in the host tier (the
    #: agent's `ModelInfo.kv_gpu_bytes`/`kv_host_bytes`).
    kv_gpu_bytes: int | None = None
    kv_host_bytes: int | None = None
    swap_ins: int | None = None
    swap_outs: int | None = None
    last_swap_in_seconds: float | None = None
    #: RFC 3339; moves in steps of at least `node_report.LAST_REQUEST_STEP_SECONDS`, so
    #: traffic alone does not rewrite the SwapNode.
    last_request_time: str | None = None
    #: CamelCase, why the model is where it is (`Loaded`, `LoadFailed`, `InsufficientHBM`,
    #: `UnsupportedRuntime`, …); `message` says it for people.
    reason: str | None = None
    message: str | None = None


@dataclass(frozen=True, kw_only=True)
class SwapNodeSpec(_Wire):
    node_name: str | None = None


@dataclass(frozen=True, kw_only=True)
class SwapNodeStatus(_Wire):
    agent_version: str | None = None
    endpoint: str | None = None
    gateway_endpoint: str | None = None
    #: `grpc://host:port` of the gateway's gRPC front (Triton's gRPC API); None: not served.
    gateway_grpc_endpoint: str | None = None
    #: PEM of the control API's serving certificate: the operator trusts exactly it for
    #: `endpoint` (`modelswap_api.tls.pinned_context`); unset with plain HTTP.
    certificate: str | None = None
    gpus: tuple[GpuStatus, ...] | None = None
    #: Summaries of `gpus` for `kubectl get swapnodes` (a printer column shows one value).
    gpu_count: int | None = None
    hbm_free_bytes: int | None = None
    #: `hbm_free_bytes` (free GPU memory summed over the GPUs) for people: HBM-FREE.
    hbm_free_size: str | None = None
    model_count: int | None = None
    node_labels: Mapping[str, str] | None = None
    node_taints: tuple[Taint, ...] | None = None
    models: tuple[HostedModel, ...] | None = None
    conditions: tuple[Condition, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class SwapNode(_Wire):
    api_version: str = API_VERSION
    kind: str = "SwapNode"
    metadata: Mapping[str, Any] = field(default_factory=dict)
    spec: SwapNodeSpec | None = None
    status: SwapNodeStatus | None = None
