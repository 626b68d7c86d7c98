"""The agent's `NodeReport` for its SwapNode, read from its real state (no side effects).

- GPUs: what the control API's `GET /v1/node` reports (capacity, reserve, per-process
  overhead, free HBM, host-store bytes and capacity, product), with the link: cuda-vmm's
  probed `pcie`/`c2c` GB/s (`gpu_links`, once at start), or the kind `sim` and its GB/s
  (configured, or measured once at start: `sim_link`);
- models: every model the agent holds (desired, or unloaded with its host copy kept),
  sorted by uid, with its phase (`Resident`, `SwappedOut`, `Loading`, …), GPU and
  resident bytes;
- the agent version and the URLs of its control API and gateway.

Every figure here changes only when something happens to a model (a load, a swap, an
unload), so comparing two reports tells whether the SwapNode needs a write.
"""

from __future__ import annotations

from collections.abc import Sequence

from modelswap_api.models import HostedModel, Link
from modelswap_sidecar.agent import reports
from modelswap_sidecar.agent.actuator import Actuator
from modelswap_sidecar.heartbeat.report import NodeReport


def url(scheme: str, host: str, port: int) -> str:
    bracketed = f"[{host}]" if ":" in host else host
    return f"{scheme}://{bracketed}:{port}"


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
    ) -> None:
        """`links` per GPU (cuda-vmm: the probed links), or sim links at `link_gbps`."""
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
        models = []
        for record in sorted(self.actuator.records.values(), key=lambda m: m.uid):
            model = reports.model_info(engine, record, uuids)
            models.append(
                HostedModel(
                    uid=model.uid,
                    namespace=model.namespace,
                    name=model.name,
                    state=model.phase,
                    gpu=model.gpu,
                    resident_bytes=model.resident_bytes,
                )
            )
        return NodeReport(
            agent_version=self.agent_version,
            endpoint=self.control_endpoint,
            gateway_endpoint=self.gateway_endpoint,
            gpus=gpus,
            models=tuple(models),
        )
