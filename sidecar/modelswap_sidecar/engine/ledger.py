"""The GPU ledger: each GPU's HBM budget and allocation lock, the runtime processes
charged to it (overhead per process, measured by the allocator where it can), and the
chunks created on it, exported and released.

Locks: a GPU's allocation lock is held by a whole swap-in or attach on that GPU (its
caller takes it, with the model's operation lock inside), so two swap-ins never evict each
other's room; each `HbmBudget` guards its own counters.
"""

from __future__ import annotations

import logging
import threading

from modelswap_sidecar.allocators.base import Allocator, Chunk, Location, OutOfDeviceMemory
from modelswap_sidecar.engine.budget import BudgetView, HbmBudget
from modelswap_sidecar.engine.errors import NoCapacity
from modelswap_sidecar.engine.records import InstanceRecord
from modelswap_sidecar.engine.settings import EngineSettings
from modelswap_sidecar.engine.table import ModelTable

log = logging.getLogger(__name__)


class GpuLedger:
    def __init__(self, allocator: Allocator, table: ModelTable, settings: EngineSettings) -> None:
        self.allocator = allocator
        self._table = table
        self._budgets: dict[int, HbmBudget] = {}
        for loc in allocator.locations():
            info = allocator.memory_info(loc)
            self._budgets[loc.index] = HbmBudget(
                loc.index,
                info.total_bytes,
                settings.reserve_bytes.get(loc.index, 0),
                settings.overhead_bytes_per_process,
            )
        self._allocation_locks = {g: threading.Lock() for g in self._budgets}

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted(self._budgets))

    def view(self, gpu: int) -> BudgetView:
        return self._budgets[gpu].view()

    def allocation_lock(self, gpu: int) -> threading.Lock:
        return self._allocation_locks[gpu]

    # -- chunks --------------------------------------------------------------------------

    def allocate(self, gpu: int, size_bytes: int) -> list[Chunk]:
        """Chunks of the allocator's preferred size covering `size_bytes`, each charged to
        the budget first; all or nothing."""
        location = Location.device(gpu)
        piece = self.allocator.preferred_chunk_bytes(location)
        budget = self._budgets[gpu]
        chunks: list[Chunk] = []
        remaining = size_bytes
        try:
            while remaining:
                size = min(piece, remaining)
                if not budget.try_charge(size):
                    raise NoCapacity(
                        f"GPU {gpu}: HBM budget exhausted "
                        f"({budget.view().available_bytes} bytes available, {size} needed)"
                    )
                try:
                    chunks.append(self.allocator.create(location, size))
                except OutOfDeviceMemory as ex:
                    budget.credit(size)
                    raise NoCapacity(f"GPU {gpu}: {ex}") from ex
                remaining -= size
        except BaseException:
            self.release(gpu, chunks)
            raise
        return chunks

    def export_fd(self, chunk: Chunk) -> int:
        return self.allocator.export_fd(chunk)

    def adopt(self, gpu: int, fd: int, size_bytes: int) -> Chunk:
        """Readopt: a chunk a client still maps, charged even past the budget (the memory
        exists already)."""
        chunk = self.allocator.adopt_fd(Location.device(gpu), fd, size_bytes)
        self._budgets[gpu].force_charge(chunk.size_bytes)
        return chunk

    def release(self, gpu: int, chunks: list[Chunk]) -> None:
        budget = self._budgets[gpu]
        for c in chunks:
            self.allocator.release(c)
            budget.credit(c.size_bytes)

    def release_instance(self, gpu: int, inst: InstanceRecord) -> None:
        """Release every chunk of `inst` (its client unmapped them, or is gone)."""
        for r in inst.regions.values():
            self.release(gpu, r.chunks)
            r.chunks = []
        inst.mapped = False

    # -- runtime processes ---------------------------------------------------------------

    def process_attached(self, gpu: int, pid: int, inst: InstanceRecord) -> None:
        """`inst` registered from process `pid`: charge the process's overhead unless
        another live instance on `gpu` runs in it already."""
        if not self._pid_in_use(gpu, pid, [inst]):
            self._budgets[gpu].process_attached(pid, self._measure(gpu, pid))

    def process_detached(self, gpu: int, pid: int, leaving: list[InstanceRecord]) -> None:
        """`leaving` no longer run in `pid`: credit its overhead unless another live
        instance on `gpu` still does."""
        if not self._pid_in_use(gpu, pid, leaving):
            self._budgets[gpu].process_detached(pid)

    def remeasure(self, gpu: int, pid: int) -> None:
        """A fresh measurement of `pid`'s overhead (a CUDA context appears after the
        process registered); a failed one keeps what the budget has."""
        self._budgets[gpu].set_measured(pid, self._measure(gpu, pid))

    def _pid_in_use(self, gpu: int, pid: int, ignore: list[InstanceRecord]) -> bool:
        """Whether another live instance on `gpu` runs in process `pid` (overhead is per
        process, however many instances it serves)."""
        with self._table.lock:
            return any(
                i.live and i.pid == pid and all(i is not x for x in ignore)
                for i in self._table.instances_on_gpu(gpu)
            )

    def _measure(self, gpu: int, pid: int) -> int | None:
        """The allocator's measurement of `pid`'s overhead on `gpu` (None: not measured)."""
        with self._table.lock:
            mapped = sum(
                i.chunk_bytes()
                for i in self._table.instances_on_gpu(gpu)
                if i.live and i.pid == pid
            )
        try:
            measured = self.allocator.process_overhead_bytes(
                Location.device(gpu), [pid], {pid: mapped}
            )
        except Exception as e:  # a measurement never breaks registration
            log.warning("GPU %d: measuring pid %d's overhead failed: %s", gpu, pid, e)
            return None
        return measured.get(pid)
