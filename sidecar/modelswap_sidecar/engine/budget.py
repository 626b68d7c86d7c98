"""The exact HBM budget of one GPU: total - configured reserve - per-process overhead.

The engine charges every chunk it creates or readopts and credits every chunk it releases;
it never allocates past `available_bytes`. Per-process overhead is what each runtime
process keeps on the GPU even while its model is out (CUDA context, workspaces). It is
tracked per process: the allocator's measurement where it has one (cuda-vmm: NVML usage
minus mapped chunks), else the configured estimate (sim: configured).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetView:
    gpu: int
    total_bytes: int
    reserve_bytes: int
    #: mean overhead of the attached processes (the configured estimate when none is)
    overhead_bytes_per_process: int
    processes: int
    used_bytes: int
    #: overhead of all attached processes together (measured or estimated, per process)
    overhead_bytes: int = 0

    @property
    def budget_bytes(self) -> int:
        return max(self.total_bytes - self.reserve_bytes - self.overhead_bytes, 0)

    @property
    def available_bytes(self) -> int:
        return max(self.budget_bytes - self.used_bytes, 0)


class HbmBudget:
    def __init__(
        self,
        gpu: int,
        total_bytes: int,
        reserve_bytes: int = 0,
        overhead_bytes_per_process: int = 0,
    ) -> None:
        self.gpu = gpu
        self._total = total_bytes
        self._reserve = reserve_bytes
        self._estimate = overhead_bytes_per_process
        #: process key (pid, or any key the engine uses) → its overhead: measured or estimate
        self._overheads: dict[int, int] = {}
        self._used = 0
        self._lock = threading.Lock()

    def _view(self) -> BudgetView:
        n = len(self._overheads)
        total_overhead = sum(self._overheads.values())
        per_process = total_overhead // n if n else self._estimate
        return BudgetView(
            self.gpu,
            self._total,
            self._reserve,
            per_process,
            n,
            self._used,
            total_overhead,
        )

    def view(self) -> BudgetView:
        with self._lock:
            return self._view()

    def try_charge(self, size_bytes: int) -> bool:
        with self._lock:
            if size_bytes > self._view().available_bytes:
                return False
            self._used += size_bytes
            return True

    def force_charge(self, size_bytes: int) -> None:
        """Readopt: the memory exists already, so it is charged even past the budget."""
        with self._lock:
            self._used += size_bytes

    def credit(self, size_bytes: int) -> None:
        with self._lock:
            if size_bytes > self._used:
                raise AssertionError(f"GPU {self.gpu}: credit {size_bytes} > used {self._used}")
            self._used -= size_bytes

    def process_attached(self, key: int, measured_bytes: int | None = None) -> None:
        """A runtime process registered: charge its overhead (the estimate until measured)."""
        with self._lock:
            if measured_bytes is None:
                self._overheads.setdefault(key, self._estimate)
            else:
                self._overheads[key] = measured_bytes

    def set_measured(self, key: int, measured_bytes: int | None) -> None:
        """A fresh measurement of an attached process; None keeps what it has."""
        with self._lock:
            if key in self._overheads and measured_bytes is not None:
                self._overheads[key] = measured_bytes

    def process_detached(self, key: int) -> None:
        with self._lock:
            self._overheads.pop(key, None)
