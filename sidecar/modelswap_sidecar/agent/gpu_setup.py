"""The allocator the agent runs, the GPUs it manages and their links, from its settings:
`build_allocator(settings)` and `measure_links(settings, inventory)`.

- ``sim``: one `SimAllocator` GPU per `gpus` entry (its `capacityBytes`), named by the
  entry's uuid, product ``sim``; links are kind ``sim`` with the configured
  `gpus[].linkGBps` (else `gpus[].paceGBps`, the link the copies are paced to).
- ``cuda-vmm``: a `CudaVmmAllocator` over the GPUs the driver shows (or the `gpus`
  entries' UUIDs); the inventory comes from the allocator — UUIDs, ordinals (under
  `CUDA_DEVICE_ORDER=PCI_BUS_ID`), product names — and HBM totals from NVML through
  `memory_info` (the engine's budget reads them). `gpus[].reserveBytes` applies by UUID,
  `gpuReserveBytes` to every other GPU. Each GPU's link is probed once (`gpu.links`)
  unless `cuda.linkProbe` is off.
- ``auto``: `gpu.inventory.resolve_backend` decides, logging one line that says why.

cuda-vmm needs the managed GPUs to be ordinals 0..n-1 of the agent's view: give the agent
(and Triton) exactly the GPUs to manage (`CUDA_VISIBLE_DEVICES`, or the device plugin),
else start-up is refused with a message that says so.

Failures raise `StartupError` naming the setting (`allocator`, `gpus`, `gpus[i].…`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from modelswap_api.models import Link
from modelswap_sidecar.agent.errors import StartupError
from modelswap_sidecar.agent.settings.values import AgentSettings
from modelswap_sidecar.allocators.base import Allocator, AllocatorError, Location
from modelswap_sidecar.gpu import links
from modelswap_sidecar.gpu.inventory import GpuInventory, NodeGpu, resolve_backend
from modelswap_sidecar.gpu.links import Prober

log = logging.getLogger(__name__)


async def measure_links(
    settings: AgentSettings, inventory: GpuInventory, *, prober: Prober | None = None
) -> tuple[Link, ...]:
    """Every managed GPU's link, in inventory order (once, at start)."""
    return await links.measure_links(
        inventory,
        links.LinkProbing(
            enabled=settings.cuda.link_probe,
            size_bytes=settings.cuda.link_probe_bytes,
            timeout_seconds=settings.cuda.link_probe_timeout_seconds,
        ),
        # a paced sim GPU's link is its pace unless a figure is configured
        sim_gbps=tuple(g.link_gbps or g.pace_gbps for g in settings.gpus),
        prober=prober,
    )


def build_allocator(
    settings: AgentSettings,
    *,
    choose: Callable[[str], str] | None = None,
    cuda_options: dict[str, object] | None = None,
) -> tuple[Allocator, GpuInventory]:
    """The allocator for `settings.allocator` and the GPUs it manages. `cuda_options` go to
    `CudaVmmAllocator` as well (tests pass `nvml=None`)."""
    backend = resolve_backend(settings.allocator, choose)
    if backend == "cuda-vmm":
        return _cuda_vmm(settings, cuda_options or {})
    return _sim(settings)


def _sim(settings: AgentSettings) -> tuple[Allocator, GpuInventory]:
    from modelswap_sidecar.allocators.sim import SimAllocator  # noqa: PLC0415

    if not settings.gpus:
        raise StartupError(
            "gpus: the sim allocator needs at least one GPU "
            f"(allocator {settings.allocator!r} found no CUDA GPU to use)"
        )
    capacities = []
    for i, g in enumerate(settings.gpus):
        if g.capacity_bytes is None:
            raise StartupError(f"gpus[{i}].capacityBytes is required with the sim allocator")
        capacities.append(g.capacity_bytes)
    allocator = SimAllocator(
        capacities_bytes=capacities, pool_chunk_bytes=settings.pool_chunk_bytes
    )
    gpus = tuple(
        NodeGpu(uuid=g.uuid, ordinal=i, product="sim", reserve_bytes=g.reserve_bytes)
        for i, g in enumerate(settings.gpus)
    )
    return allocator, GpuInventory("sim", gpus)


def _cuda_vmm(
    settings: AgentSettings, options: dict[str, object]
) -> tuple[Allocator, GpuInventory]:
    from modelswap_sidecar.allocators.cuda_vmm import CudaVmmAllocator  # noqa: PLC0415

    # entries with capacityBytes are sim GPUs (auto's fallback); the others select by UUID
    wanted = [g.uuid for g in settings.gpus if g.capacity_bytes is None] or None
    if settings.allocator == "auto" and any(g.capacity_bytes is not None for g in settings.gpus):
        log.info("allocator auto chose cuda-vmm: the sim GPU entries in gpus are not used")
    try:
        allocator = CudaVmmAllocator(
            gpus=wanted,
            chunk_bytes=settings.cuda.chunk_bytes,
            max_chunk_bytes=settings.cuda.max_chunk_bytes,
            **options,  # type: ignore[arg-type]
        )
    except AllocatorError as e:
        raise StartupError(f"allocator: cuda-vmm: {e}") from e
    try:
        ordinals = [g.ordinal for g in allocator.gpus]
        if sorted(ordinals) != list(range(len(ordinals))):
            raise StartupError(
                f"gpus: cuda-vmm manages GPUs {ordinals} of this process's view; the agent "
                "needs them to be ordinals 0..n-1 — give the agent and Triton exactly the "
                "GPUs to manage (CUDA_VISIBLE_DEVICES)"
            )
        reserves = {g.uuid.lower(): g.reserve_bytes for g in settings.gpus}
        gpus = tuple(
            NodeGpu(
                uuid=g.uuid,
                ordinal=g.ordinal,
                product=g.name,
                reserve_bytes=reserves.get(g.uuid.lower(), settings.gpu_reserve_bytes),
            )
            for g in sorted(allocator.gpus, key=lambda g: g.ordinal)
        )
        for g in gpus:
            info = allocator.memory_info(Location.device(g.ordinal))
            if g.reserve_bytes >= info.total_bytes:
                raise StartupError(
                    f"gpus: reserveBytes of {g.uuid} ({g.reserve_bytes}) is not below its HBM "
                    f"total ({info.total_bytes})"
                )
            log.info(
                "cuda-vmm GPU %d: %s (%s), HBM %d MiB total, %d MiB free, %d MiB reserved",
                g.ordinal,
                g.uuid,
                g.product,
                info.total_bytes >> 20,
                info.free_bytes >> 20,
                g.reserve_bytes >> 20,
            )
    except BaseException:
        allocator.close()
        raise
    return allocator, GpuInventory("cuda-vmm", gpus)
