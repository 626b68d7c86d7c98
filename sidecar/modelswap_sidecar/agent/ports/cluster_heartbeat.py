"""Cluster mode: the agent's heartbeat (its SwapNode and node Lease) beside its loops.

    async with node_heartbeat(settings, actuator, service, control_port=…, gateway_port=…):
        ...   # the agent runs

With a `kube` section in the settings (never in local mode) this builds the API client
(a kubeconfig path or the in-cluster service account), a `NodeReporter` over the agent's
real state, and a `Heartbeat` whose renewals feed the control service's fencing rule
(`record_lease_renewal`). A small watch compares the report every policy interval and
asks the heartbeat to compare and write (`status_changed()`) as soon as anything in it
changed — a load, a swap, an unload — instead of at its next status interval. Without a
`kube` section it yields None and does nothing.

Leaving the block stops the renewals (the Lease then goes stale: the operator treats the
node as lost) and closes the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from modelswap_api.models import Link
from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.ports.node_report import NodeReporter, url
from modelswap_sidecar.agent.settings.values import AgentSettings
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.gpu.sim_link import measure_copy_gbps
from modelswap_sidecar.heartbeat.heartbeat import Heartbeat
from modelswap_sidecar.heartbeat.report import NodeReport

log = logging.getLogger(__name__)

_WILDCARDS = ("", "0.0.0.0", "::")


def advertised_host(settings: AgentSettings) -> str:
    """The host the SwapNode's endpoints name: `kube.advertiseHost` (the pod IP), else the
    control API's host when it is a specific address, else this host's name."""
    if settings.kube is not None and settings.kube.advertise_host:
        return settings.kube.advertise_host
    if settings.control_host not in _WILDCARDS:
        return settings.control_host
    return socket.gethostname()


async def link_speeds(settings: AgentSettings) -> list[float]:
    """Each GPU's configured `linkGBps` (else its `paceGBps`: the link its copies are paced
    to), the measured copy rate where neither is set."""
    configured = [g.link_gbps or g.pace_gbps for g in settings.gpus]
    if all(g is not None for g in configured):
        return [g for g in configured if g is not None]
    measured = await asyncio.to_thread(measure_copy_gbps)
    log.info("sim link: host memory copies at %.3g GB/s", measured)
    return [measured if g is None else g for g in configured]


async def watch_report(
    report: Callable[[], NodeReport], heartbeat: Heartbeat, interval_seconds: float
) -> None:
    """Nudge the heartbeat whenever the report differs from the last one seen."""
    last: NodeReport | None = None
    while True:
        try:
            current = report()
        except Exception:
            log.exception("cannot build the node report")
        else:
            if current != last:
                heartbeat.status_changed()
                last = current
        await asyncio.sleep(interval_seconds)


@contextlib.asynccontextmanager
async def node_heartbeat(
    settings: AgentSettings,
    actuator: Actuator,
    service: ControlService,
    *,
    control_port: int,
    gateway_port: int | None,
    links: Sequence[Link] | None = None,
    products: Sequence[str] | None = None,
    certificate_pem: str | None = None,
    api: Any = None,
    gateway_grpc_port: int | None = None,
) -> AsyncIterator[Heartbeat | None]:
    """`links`/`products` per GPU (cuda-vmm: probed at start); None: sim links.
    `certificate_pem`: the control API's serving certificate, published in the SwapNode
    (the endpoint is then https); None: plain HTTP. `api`: an API client built already
    (`kube_access.api_client`), else one is built here."""
    access = settings.kube
    if access is None or settings.local_mode:
        yield None
        return
    from modelswap_api import kube  # noqa: PLC0415 - the kubernetes client only when used
    from modelswap_sidecar.heartbeat.cluster import KubeNodeCluster  # noqa: PLC0415

    host = advertised_host(settings)
    scheme = "https" if certificate_pem is not None else "http"
    reporter = NodeReporter(
        actuator,
        node_name=settings.node_name,
        agent_version=settings.agent_version,
        link_gbps=await link_speeds(settings) if links is None else (),
        links=links,
        products=products,
        control_endpoint=url(scheme, host, control_port),
        gateway_endpoint=url("http", host, gateway_port) if gateway_port else None,
        gateway_grpc_endpoint=url("grpc", host, gateway_grpc_port) if gateway_grpc_port else None,
        certificate_pem=certificate_pem,
    )
    kubeconfig = str(access.kubeconfig) if access.kubeconfig is not None else None
    if api is None:
        api = kube.api_client(kubeconfig)
    heartbeat = Heartbeat(
        access.heartbeat,
        KubeNodeCluster(api, timeout_seconds=access.heartbeat.request_timeout_seconds),
        reporter,
        on_renewed=service.record_lease_renewal,
    )
    try:
        async with heartbeat:
            watch = asyncio.create_task(
                watch_report(reporter, heartbeat, settings.policy.interval_seconds),
                name="heartbeat-report-watch",
            )
            log.info(
                "heartbeat: SwapNode %s, Lease %s/%s every %.3g s (%s)",
                settings.node_name,
                access.heartbeat.lease_namespace,
                settings.node_name,
                access.heartbeat.renew_interval_seconds,
                kubeconfig or "in-cluster",
            )
            try:
                yield heartbeat
            finally:
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
    finally:
        await asyncio.to_thread(api.close)
