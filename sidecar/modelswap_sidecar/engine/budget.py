"""The exact HBM budget of one GPU: total - configured reserve - per-process overhead.

The engine charges every chunk it creates or readopts and credits every chunk it releases;
it never allocates past `available_bytes`. Per-process overhead is what each runtime
process keeps on the GPU even while its model is out (CUDA context, workspaces): measured
for CUDA, configured for sim.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetView:
    gpu: int
    total_bytes: int
    reserve_bytes: int
    overhead_bytes_per_process: int
    processes: int
    used_bytes: int

    @property
    def budget_bytes(self) -> int:
        return max(
            self.total_bytes
            - self.reserve_bytes
            - self.overhead_bytes_per_process * self.processes,
            0,
        )

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
        self._overhead = overhead_bytes_per_process
        self._processes = 0
        self._used = 0
        self._lock = threading.Lock()

    def view(self) -> BudgetView:
        with self._lock:
            return BudgetView(
                self.gpu, self._total, self._reserve, self._overhead, self._processes, self._used
            )

    def try_charge(self, size_bytes: int) -> bool:
        with self._lock:
            view = BudgetView(
                self.gpu, self._total, self._reserve, self._overhead, self._processes, self._used
            )
            if size_bytes > view.available_bytes:
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

    def process_attached(self) -> None:
        with self._lock:
            self._processes += 1

    def process_detached(self) -> None:
        with self._lock:
            self._processes = max(self._processes - 1, 0)
