"""GPUs as the agent sees them: keyed by UUID, mapped to CUDA ordinals, capabilities probed.

The agent runs with `CUDA_DEVICE_ORDER=PCI_BUS_ID` (set before `cuInit`), so its ordinals
follow PCI bus order, like NVML's indices. Model processes may see other ordinals (their
own `CUDA_VISIBLE_DEVICES`), which is why everything the agent sends names a GPU by UUID.

Standard library + `cuda.bindings` (through `modelswap_client.cuda_compat`) only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass

from modelswap_client import cuda_compat as cc

log = logging.getLogger(__name__)

DEVICE_ORDER = "PCI_BUS_ID"


@dataclass(frozen=True, slots=True)
class GpuCapabilities:
    """What the backends need to know about one GPU (`cuDeviceGetAttribute`)."""

    vmm: bool  # cuMemCreate / cuMemMap
    posix_fd_handles: bool  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR export/import
    host_numa_id: int  # the host NUMA node nearest the GPU; -1 when unknown
    copy_engines: int  # CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT
    concurrent_managed_access: bool  # managed prefetch possible
    host_page_tables: bool  # GPU walks the CPU's page tables (ATS: Grace NVLink-C2C)
    host_register: bool
    read_only_host_register: bool  # CU_MEMHOSTREGISTER_READ_ONLY works

    @property
    def cuda_vmm_ok(self) -> bool:
        return self.vmm and self.posix_fd_handles


@dataclass(frozen=True, slots=True)
class GpuInfo:
    ordinal: int
    uuid: str
    name: str
    pci_bus_id: str
    total_bytes: int
    capabilities: GpuCapabilities


def ensure_pci_bus_order(environ: MutableMapping[str, str] | None = None) -> None:
    """Set `CUDA_DEVICE_ORDER=PCI_BUS_ID` before `cuInit`; a different value is overridden
    with a warning (ordinals must match NVML's indices)."""
    env = os.environ if environ is None else environ
    current = env.get("CUDA_DEVICE_ORDER")
    if current != DEVICE_ORDER:
        if current:
            log.warning("CUDA_DEVICE_ORDER=%s overridden with %s", current, DEVICE_ORDER)
        env["CUDA_DEVICE_ORDER"] = DEVICE_ORDER


def _text(raw: object) -> str:
    data = raw if isinstance(raw, bytes) else str(raw).encode()
    return data.split(b"\0", 1)[0].decode(errors="replace")


def _attribute(b: cc.Bindings, device: object, name: str, default: int) -> int:
    """One device attribute; `default` when the bindings or the driver do not know it."""
    attr = getattr(b.driver.CUdevice_attribute, name, None)
    if attr is None:
        return default
    result = b.driver.cuDeviceGetAttribute(attr, device)
    return int(result[1]) if cc.code_of(result) == cc.CUDA_SUCCESS else default


def probe_capabilities(b: cc.Bindings, device: object) -> GpuCapabilities:
    def flag(name: str) -> bool:
        return _attribute(b, device, name, 0) != 0

    return GpuCapabilities(
        vmm=flag("CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"),
        posix_fd_handles=flag("CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED"),
        host_numa_id=_attribute(b, device, "CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID", -1),
        copy_engines=_attribute(b, device, "CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT", 1),
        concurrent_managed_access=flag("CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS"),
        host_page_tables=flag("CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES"),
        host_register=flag("CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED"),
        read_only_host_register=flag("CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED"),
    )


def probe_devices(b: cc.Bindings) -> list[GpuInfo]:
    """Every GPU the driver shows (after `cuInit`), in ordinal order. Raises `CudaError`."""
    d = b.driver
    count = int(cc.check(b, "cuDeviceGetCount", d.cuDeviceGetCount()))
    found = []
    for ordinal in range(count):
        dev = cc.check(b, "cuDeviceGet", d.cuDeviceGet(ordinal))
        found.append(
            GpuInfo(
                ordinal=ordinal,
                uuid=cc.device_uuid(b, dev),
                name=_text(cc.check(b, "cuDeviceGetName", d.cuDeviceGetName(96, dev))),
                pci_bus_id=_text(
                    cc.check(b, "cuDeviceGetPCIBusId", d.cuDeviceGetPCIBusId(32, dev))
                ),
                total_bytes=int(cc.check(b, "cuDeviceTotalMem", d.cuDeviceTotalMem(dev))),
                capabilities=probe_capabilities(b, dev),
            )
        )
    return found


def select(gpus: list[GpuInfo], wanted: list[str | int] | None) -> list[GpuInfo]:
    """The GPUs named by UUID or ordinal (all when `wanted` is None). Unknown → ValueError."""
    if wanted is None:
        return list(gpus)
    chosen = []
    for key in wanted:
        match = [
            g for g in gpus if (isinstance(key, int) and g.ordinal == key) or
            (isinstance(key, str) and g.uuid.lower() == key.lower())
        ]  # fmt: skip
        if not match:
            raise ValueError(f"GPU {key!r} not found; visible: {[g.uuid for g in gpus]}")
        chosen.append(match[0])
    return chosen


def choose_allocator_backend(requested: str = "auto") -> str:
    """ "sim" | "cuda-vmm" for the agent: "auto" picks cuda-vmm when a driver and a capable
    GPU are present, else sim — logging one line that says which and why."""
    if requested != "auto":
        return requested
    try:
        b = cc.load()
        cc.initialize(b)
        gpus = [g for g in probe_devices(b) if g.capabilities.cuda_vmm_ok]
    except (cc.CudaUnavailable, cc.CudaError) as e:
        log.info("allocator backend: sim (no CUDA backend selected: %s)", e)
        return "sim"
    if not gpus:
        log.info("allocator backend: sim (no GPU supports VMM with POSIX-fd handles)")
        return "sim"
    log.info("allocator backend: cuda-vmm (%d capable GPUs)", len(gpus))
    return "cuda-vmm"
