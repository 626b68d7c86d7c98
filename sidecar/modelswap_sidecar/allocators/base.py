"""The Allocator: the agent's side of GPU memory, one small interface for every backend.

The agent owns the node's model memory. It creates physical chunks on a GPU (or in host
memory), exports each as a file descriptor that travels to a model process over
`SCM_RIGHTS`, and releases chunks when a model is swapped out. The engine talks to this
interface only; it never imports CUDA. Backends, each imported only when the agent
builds it (`agent/gpu_setup.py`):

- ``sim``: "HBM" is a pool of pre-populated memfd chunks under a per-GPU capacity counter
  (any CPU machine, CI).
- ``cuda-vmm``: `cuMemCreate` (pinned, POSIX-fd handle type) and
  `cuMemExportToShareableHandle`; no CUDA context needed. Built in its own issue.

Contract every backend keeps (the sim backend enforces it, so sim-tested code is
CUDA-shaped):

- Sizes are multiples of `granularity_bytes(location)` (2 MiB for both backends); anything
  else raises `AllocatorError`. Callers split large allocations into chunks of at most
  `max_chunk_bytes(location)` bytes; `preferred_chunk_bytes(location)` is the size that
  keeps per-call cost low (`cuMemCreate` ~0.2 ms per call).
- `create` never crashes the agent when memory is short: it raises `OutOfDeviceMemory`
  (the engine backs off, swaps out victims, or refuses with a reason).
- `export_fd` returns a NEW file descriptor the caller owns; the caller sends it and
  closes it. The importer (the client) closes its received fd right after importing it
  (an open fd pins the memory). A chunk may be exported any number of times.
- A chunk is never handed to a second owner after `release`: the sim backend closes the
  memfd and creates a fresh one (a client that kept a dup must never see the next
  tenant's bytes); for CUDA, `cuMemRelease` does the same.
- `release` drops the agent's handle. Physical memory is freed once every importer has
  unmapped and released its own handle too; the capacity counter is credited at once
  (the engine only releases chunks its clients have unmapped, or whose clients are dead).
- `adopt_fd` is readopt after an agent restart: a client that still maps a chunk
  re-exports it (`cuMemRetainAllocationHandle` + export; the sim client sends a dup it
  kept) and the new agent takes a handle on it, charged to capacity, so the pool is
  capacity minus readopted bytes. `adopt_fd` does not close the fd it is given.
- `process_overhead_bytes` (optional) measures what each runtime process keeps on the GPU
  besides its mapped chunks (cuda-vmm: NVML usage minus mapped bytes; sim: configured);
  the engine's budget subtracts it per process, falling back to its configured estimate.
- `memory_info` is what the allocator itself accounts (the sim capacity counter; NVML for
  CUDA), independent of the engine's budget, which subtracts its own reserves.
- Thread-safe: the engine may call any method from several threads.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NewType

MIB = 1 << 20
GIB = 1 << 30
#: CUDA's VMM allocation granularity on current GPUs; the sim backend enforces the same.
GRANULARITY_BYTES = 2 * MIB

ChunkId = NewType("ChunkId", int)


class AllocatorError(Exception):
    """A request the allocator refuses (bad size, unknown location, released chunk)."""


class OutOfDeviceMemory(AllocatorError):  # noqa: N818 - reads as the condition it is
    """Not enough free memory at the location; the caller may free some and retry."""

    def __init__(self, message: str, *, requested_bytes: int, free_bytes: int) -> None:
        super().__init__(message)
        self.requested_bytes = requested_bytes
        self.free_bytes = free_bytes


class LocationKind(enum.StrEnum):
    DEVICE = "device"
    HOST = "host"


@dataclass(frozen=True, slots=True)
class Location:
    """Where a chunk lives: a GPU by ordinal, or host memory on a NUMA node (-1: any)."""

    kind: LocationKind
    index: int

    @classmethod
    def device(cls, ordinal: int) -> Location:
        return cls(LocationKind.DEVICE, ordinal)

    @classmethod
    def host(cls, numa_node: int = -1) -> Location:
        return cls(LocationKind.HOST, numa_node)

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"


@dataclass(frozen=True, slots=True)
class Chunk:
    """One physical allocation. Identity is `chunk_id`, unique for the allocator's life."""

    chunk_id: ChunkId
    location: Location
    size_bytes: int


@dataclass(frozen=True, slots=True)
class MemoryInfo:
    """The allocator's own accounting for one location.

    `total_bytes` is the capacity it manages, `used_bytes` what live chunks (created or
    adopted, not yet released) hold, `free_bytes` what `create` can still hand out.
    """

    location: Location
    total_bytes: int
    used_bytes: int
    free_bytes: int


class Allocator(abc.ABC):
    """Creates, exports and releases physical chunks for the agent. See the module doc."""

    #: backend name: "sim" or "cuda-vmm"
    name: str = ""

    @abc.abstractmethod
    def locations(self) -> list[Location]:
        """The locations this allocator can create chunks at (every GPU it manages)."""

    @abc.abstractmethod
    def granularity_bytes(self, location: Location) -> int:
        """Every size must be a multiple of this (2 MiB)."""

    @abc.abstractmethod
    def preferred_chunk_bytes(self, location: Location) -> int:
        """The chunk size callers should split allocations into (a granularity multiple)."""

    @abc.abstractmethod
    def max_chunk_bytes(self, location: Location) -> int:
        """The largest single chunk `create` accepts at `location`."""

    @abc.abstractmethod
    def create(self, location: Location, size_bytes: int) -> Chunk:
        """Create a chunk of exactly `size_bytes` at `location`.

        Raises `OutOfDeviceMemory` when the location lacks room and `AllocatorError` for a
        size that is not a granularity multiple or exceeds `max_chunk_bytes`.
        """

    @abc.abstractmethod
    def export_fd(self, chunk: Chunk) -> int:
        """A new fd for the chunk (`cuMemExportToShareableHandle`); the caller closes it."""

    @abc.abstractmethod
    def release(self, chunk: Chunk) -> None:
        """Drop the agent's handle and credit the capacity. Idempotent for a live chunk's id."""

    @abc.abstractmethod
    def adopt_fd(self, location: Location, fd: int, size_bytes: int) -> Chunk:
        """Take a handle on a chunk a client re-exported after an agent restart (readopt).

        The chunk is charged to `location`'s capacity even when that overcommits it (the
        memory exists; the engine sees `free_bytes` go to zero). `fd` stays the caller's.
        """

    @abc.abstractmethod
    def memory_info(self, location: Location) -> MemoryInfo:
        """The allocator's own accounting for `location`."""

    def process_overhead_bytes(
        self,
        location: Location,
        pids: Iterable[int],
        mapped_bytes_by_pid: dict[int, int] | None = None,
    ) -> dict[int, int | None]:
        """Measured per-process overhead at `location` of runtime processes `pids`: what
        each keeps on the GPU besides the model chunks it maps (`mapped_bytes_by_pid`),
        e.g. its CUDA context and workspaces. None for a pid the backend cannot measure;
        the engine then uses its configured estimate. Default: nothing is measured."""
        return dict.fromkeys(pids)

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release every chunk and stop background work. The allocator is unusable after."""
