"""GPU memory from NVML: totals and free bytes without a CUDA context, per-process usage.

`NvmlMemory.open()` returns None when nvidia-ml-py or the NVML library is missing (the
caller falls back to `cuDeviceTotalMem` and its own accounting, and says so once).

Per-process overhead: every runtime process keeps a CUDA context, cuBLAS workspaces and
the like on the GPU even while its model is swapped out. The agent measures it as NVML's
per-process usage minus what the process maps from the agent's chunks (whether NVML
charges imported VMM memory to the importer depends on the driver; subtracting it keeps
the figure right either way, clamped at zero). `overhead_bytes` is that pure arithmetic.

Standard library + `pynvml` (nvidia-ml-py) only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NvmlMemoryInfo:
    total_bytes: int
    free_bytes: int
    used_bytes: int


class NvmlError(RuntimeError):
    pass


class NvmlMemory:
    """A session with NVML (`nvmlInit` … `nvmlShutdown`), devices looked up by UUID."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls) -> NvmlMemory | None:
        try:
            import pynvml  # noqa: PLC0415 - optional, loaded at use
        except ImportError:
            log.warning("nvidia-ml-py is not installed: GPU memory info falls back to CUDA totals")
            return None
        try:
            pynvml.nvmlInit()
        except Exception as e:
            log.warning("NVML unavailable (%s): GPU memory info falls back to CUDA totals", e)
            return None
        return cls(pynvml)

    def _handle(self, uuid: str) -> Any:
        with self._lock:
            handle = self._handles.get(uuid)
            if handle is None:
                try:
                    handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
                except Exception as e:
                    raise NvmlError(f"NVML has no GPU {uuid}: {e}") from e
                self._handles[uuid] = handle
            return handle

    def memory(self, uuid: str) -> NvmlMemoryInfo:
        try:
            info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle(uuid))
        except NvmlError:
            raise
        except Exception as e:
            raise NvmlError(f"nvmlDeviceGetMemoryInfo({uuid}): {e}") from e
        return NvmlMemoryInfo(int(info.total), int(info.free), int(info.used))

    def process_used_bytes(self, uuid: str) -> dict[int, int | None]:
        """pid → GPU bytes NVML charges to it (None where NVML cannot say, e.g. in a
        container that does not share the host's PID namespace)."""
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle(uuid))
        except NvmlError:
            raise
        except Exception as e:
            raise NvmlError(f"nvmlDeviceGetComputeRunningProcesses({uuid}): {e}") from e
        used: dict[int, int | None] = {}
        for p in procs:
            value = getattr(p, "usedGpuMemory", None)
            used[int(p.pid)] = int(value) if value is not None else None
        return used

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._nvml.nvmlShutdown()
        except Exception as e:
            log.debug("nvmlShutdown: %s", e)


def overhead_bytes(
    used_by_pid: Mapping[int, int | None],
    pids: Iterable[int],
    mapped_bytes_by_pid: Mapping[int, int] | None = None,
) -> dict[int, int | None]:
    """Per-process overhead of `pids`: NVML usage minus mapped model chunks, ≥ 0.

    A pid NVML does not list has no context on the GPU (0); one NVML lists without a
    figure stays None (unknown), and the caller uses its configured estimate for it.
    """
    mapped = mapped_bytes_by_pid or {}
    result: dict[int, int | None] = {}
    for pid in pids:
        if pid not in used_by_pid:
            result[pid] = 0
            continue
        used = used_by_pid[pid]
        result[pid] = None if used is None else max(0, used - mapped.get(pid, 0))
    return result
