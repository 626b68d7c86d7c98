"""Each managed GPU's host link, as the SwapNode, `GET /v1/node` and the metrics report it.

- cuda-vmm: the link probe (`gpu.link_probe.probe_link`) runs once per GPU at agent start,
  one after another, each in a short-lived child process (the agent itself keeps no CUDA
  context): pinned copies both ways, median GB/s, classified `pcie` or `c2c`. A probe that
  fails or times out is logged and that GPU's link is reported without a kind or figures
  (the agent still serves). `cuda.linkProbe: false` skips it (same report).
- sim: kind `sim`; the figures are the configured `gpus[].linkGBps` where set (the
  cluster heartbeat also measures the host's copy rate for the others, `sim_link`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from modelswap_api.models import Link
from modelswap_sidecar.gpu.inventory import GpuInventory
from modelswap_sidecar.gpu.link_probe import LinkProbe, LinkProbeError

log = logging.getLogger(__name__)

#: `probe(uuid, size_bytes=…, timeout_seconds=…) -> LinkProbe`; tests pass their own.
Prober = Callable[..., LinkProbe]


@dataclass(frozen=True, kw_only=True)
class LinkProbing:
    """How cuda-vmm GPUs' links are probed (the agent's `cuda.linkProbe*` settings)."""

    enabled: bool = True
    size_bytes: int
    timeout_seconds: float


def sim_links(gbps: Sequence[float | None]) -> tuple[Link, ...]:
    """One `sim` link per GPU with its configured GB/s (None: not configured)."""
    return tuple(Link(kind="sim", host_to_device_gbps=g, device_to_host_gbps=g) for g in gbps)


def probe_gpu(uuid: str, probing: LinkProbing, prober: Prober | None = None) -> Link:
    """One GPU's probed link (blocking: run it in a thread); an unknown link on failure."""
    if prober is None:
        from modelswap_sidecar.gpu.link_probe import probe_link  # noqa: PLC0415

        prober = probe_link
    try:
        probe = prober(uuid, size_bytes=probing.size_bytes, timeout_seconds=probing.timeout_seconds)
    except (LinkProbeError, OSError) as e:
        log.warning("link probe of %s failed, its link is reported unknown: %s", uuid, e)
        return Link()
    log.info(
        "link probe %s: %s, host->device %.1f GB/s, device->host %.1f GB/s (%d MiB copies)",
        uuid,
        probe.kind,
        probe.h2d_gbps,
        probe.d2h_gbps,
        probe.size_bytes >> 20,
    )
    return Link(
        kind="c2c" if probe.kind == "c2c" else "pcie",
        host_to_device_gbps=probe.h2d_gbps,
        device_to_host_gbps=probe.d2h_gbps,
    )


async def measure_links(
    inventory: GpuInventory,
    probing: LinkProbing,
    *,
    sim_gbps: Sequence[float | None] = (),
    prober: Prober | None = None,
) -> tuple[Link, ...]:
    """Every managed GPU's link, in inventory order (once, at start); a sim inventory's
    links carry `sim_gbps` (the configured figures, by position)."""
    if inventory.backend == "sim":
        configured = list(sim_gbps) + [None] * (len(inventory.gpus) - len(sim_gbps))
        return sim_links(configured[: len(inventory.gpus)])
    if not probing.enabled:
        log.info("link probe off (cuda.linkProbe: false): links reported unknown")
        return tuple(Link() for _ in inventory.gpus)
    links = []
    for gpu in inventory.gpus:  # one at a time: concurrent probes would share host bandwidth
        links.append(await asyncio.to_thread(probe_gpu, gpu.uuid, probing, prober))
    return tuple(links)
