"""The agent's `NodeReport` for its SwapNode, read from its real state (no side effects).

- GPUs: what the control API's `GET /v1/node` reports (capacity, reserve, per-process
  overhead, free HBM, host-store bytes and capacity, product), with the link: cuda-vmm's
  probed `pcie`/`c2c` GB/s (`gpu.links`, once at start), or the kind `sim` and its GB/s
  (configured, or measured once at start: `gpu.sim_link`);
- models: every model the agent holds (desired, or unloaded with its host copy kept),
  sorted by uid, with what the operator copies into its ModelDeployment's status: phase
  as `state` (`Resident`, `SwappedOut`, `Loading`, …), GPU, generation, `desired`,
  resident and host-store bytes, swap counts, the last swap-in's duration, the last
  request time, and `reason` (CamelCase) with `message` (for people);
- the agent version, the URLs of its control API and gateway, and the control API's
  serving certificate (PEM; the operator pins it).

Every figure here changes only when something happens to a model (a load, a swap, an
unload) — the last request time too, since it is shown in steps of at least
`LAST_REQUEST_STEP_SECONDS` — so comparing two reports tells whether the SwapNode needs a
write.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from modelswap_api.models import HostedModel, Link
from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.ports import reports
from modelswap_sidecar.heartbeat.report import NodeReport

#: The SwapNode's `lastRequestTime` moves only to a request at least this much later than
#: the one it shows. The status is written whenever the report changes, so an exact time
#: would turn every request into an API-server write; 10 s is finer than any useful
#: `idleAfter` and bounds a busy model to one write per 10 s (`GET /v1/models` has the
#: exact time).
LAST_REQUEST_STEP_SECONDS = 10.0
#: The CRD's bounds on a hosted model's `reason` and `message` (a longer value would make
#: the API server refuse the whole status write).
MAX_REASON_CHARS = 128
MAX_MESSAGE_CHARS = 1024


def url(scheme: str, host: str, port: int) -> str:
    bracketed = f"[{host}]" if ":" in host else host
    return f"{scheme}://{bracketed}:{port}"


class RequestTimeSteps:
    """Per model, the last-request time the SwapNode shows (wall seconds): it follows the
    real one only once that is `step_seconds` past it (or earlier than it: a restarted
    count), so a model under steady traffic changes the report once per step."""

    def __init__(self, step_seconds: float = LAST_REQUEST_STEP_SECONDS) -> None:
        self.step_seconds = step_seconds
        self._shown_seconds: dict[str, float] = {}

    def shown(self, uid: str, actual_seconds: float | None) -> float | None:
        if actual_seconds is None:
            self._shown_seconds.pop(uid, None)
            return None
        shown = self._shown_seconds.get(uid)
        if shown is None or not shown <= actual_seconds < shown + self.step_seconds:
            shown = self._shown_seconds[uid] = actual_seconds
        return shown

    def keep_only(self, uids: Collection[str]) -> None:
        """Forget models no longer held."""
        for uid in self._shown_seconds.keys() - set(uids):
            del self._shown_seconds[uid]


def bounded(text: str | None, max_chars: int) -> str | None:
    """`text` cut to `max_chars` (an ellipsis marking the cut); None for empty text."""
    if not text:
        return None
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


class NodeReporter:
    """`() -> NodeReport`: the heartbeat's report provider (quick, non-blocking)."""

    def __init__(
        self,
        actuator: Actuator,
        *,
        node_name: str,
        agent_version: str,
        link_gbps: Sequence[float] = (),
        links: Sequence[Link] | None = None,
        products: Sequence[str] | None = None,
        control_endpoint: str | None,
        gateway_endpoint: str | None,
        certificate_pem: str | None = None,
        gateway_grpc_endpoint: str | None = None,
    ) -> None:
        """`links` per GPU (cuda-vmm: the probed links), or sim links at `link_gbps`;
        `certificate_pem`: the control API's serving certificate (None: plain HTTP)."""
        if links is None:
            links = tuple(
                Link(kind="sim", host_to_device_gbps=g, device_to_host_gbps=g) for g in link_gbps
            )
        if len(links) != len(actuator.gpu_uuids):
            raise ValueError("one link per GPU")
        if products is not None and len(products) != len(actuator.gpu_uuids):
            raise ValueError("one product name per GPU")
        self.actuator = actuator
        self.node_name = node_name
        self.agent_version = agent_version
        self.links = tuple(links)
        self.products = tuple(products) if products is not None else None
        self.control_endpoint = control_endpoint
        self.gateway_endpoint = gateway_endpoint
        self.gateway_grpc_endpoint = gateway_grpc_endpoint
        self.certificate_pem = certificate_pem
        self.request_times = RequestTimeSteps()

    def __call__(self) -> NodeReport:
        engine, uuids = self.actuator.engine, self.actuator.gpu_uuids
        info = reports.node_info(
            engine,
            self.node_name,
            self.agent_version,
            uuids,
            products=self.products,
            links=self.links,
        )
        gpus = tuple(info.gpus)
        records = sorted(
            reports.reported(self.actuator.records.values()), key=lambda m: m.deployment_uid
        )
        self.request_times.keep_only([record.uid for record in records])
        models = []
        for record, model in zip(records, reports.model_infos(engine, records, uuids), strict=True):
            last_request = self.request_times.shown(record.uid, record.last_request_wall_seconds)
            models.append(
                HostedModel(
                    uid=model.uid,
                    namespace=model.namespace,
                    name=model.name,
                    state=model.phase,
                    gpu=model.gpu,
                    resident_bytes=model.resident_bytes,
                    generation=model.generation,
                    model_generation=model.model_generation,
                    rollout_reason=model.rollout_reason,
                    rollout_model_generation=model.rollout_model_generation,
                    rollout_message=bounded(model.rollout_message, MAX_MESSAGE_CHARS),
                    desired=model.desired,
                    host_bytes=model.host_bytes,
                    kv_gpu_bytes=model.kv_gpu_bytes,
                    kv_host_bytes=model.kv_host_bytes,
                    swap_ins=model.swap_ins,
                    swap_outs=model.swap_outs,
                    last_swap_in_seconds=model.last_swap_in_seconds,
                    last_request_time=reports.rfc3339(last_request),
                    reason=bounded(model.reason, MAX_REASON_CHARS),
                    message=bounded(model.message, MAX_MESSAGE_CHARS),
                )
            )
        return NodeReport(
            agent_version=self.agent_version,
            endpoint=self.control_endpoint,
            gateway_endpoint=self.gateway_endpoint,
            gateway_grpc_endpoint=self.gateway_grpc_endpoint,
            certificate=self.certificate_pem,
            gpus=gpus,
            models=tuple(models),
        )
