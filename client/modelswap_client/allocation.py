"""Allocating into a region: torch tensors created inside `Attachment.allocations(tag)` land
in that region, so unmodified loading code pages with the region (GPU backends only).

    with att.allocations("weights"):
        model = AutoModel.from_pretrained(path).cuda()
    att.commit()

This is the route vLLM's `CuMemAllocator` and SGLang's `torch_memory_saver` take: a
`torch.cuda.memory.MemPool` whose allocator is a `CUDAPluggableAllocator`. Theirs create
and map physical memory per allocation; here the region is already mapped by the client
library at a stable address, so the pluggable allocator only hands out pieces of its
address range: the C shim `_region_alloc.c` (built by `native_build`) keeps an arena per
region, best fit over a block list with coalescing, 512-byte aligned, one mutex per arena,
NULL when full (torch then raises its `OutOfMemoryError`). The shim never touches the
memory, so swapping the region out and in under torch's feet is invisible to it.

What this module holds:

- `Arena`: one arena over an address range, through ctypes (the tests drive it on the CPU
  against a made-up base address); `stats()` gives bytes in use, peak, largest free block
  and the refused frees (addresses it never gave out).
- `RegionPool`: an arena bound to one of the shim's slots (for good: torch may free into
  it for as long as it holds the pool) and a `MemPool` over that slot's entry points;
  `use()` routes this thread's CUDA allocations on the region's GPU into it.
- `allocations(attachment, tag)`: what `Attachment.allocations` returns: one `RegionPool`
  per attachment and tag, kept while the attachment lives; entered, it holds the model
  resident (`in_use()`, so the region is mapped while tensors are written) and routes
  allocations into the pool.

torch is imported only when a pool is made; the shim is loaded (and built, if missing)
only when an arena is made. torch's rules apply as they are: only allocations made by the
entering thread on the region's GPU go to the pool; freed tensors stay cached in the pool
(the region) for reuse by later allocations inside `allocations()`; the caching allocator
asks for segments of 2 MiB (tensors up to 1 MiB), 20 MiB (1-10 MiB) or the size rounded
up to 2 MiB, so a region needs headroom over the tensors' bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from modelswap_client import native_build
from modelswap_client.errors import ClientError
from modelswap_client.regions import Region

__all__ = ["Arena", "ArenaStats", "RegionPool", "Shim", "allocations", "load_shim"]

_STAT_FIELDS = (
    "size_bytes",
    "in_use_bytes",
    "peak_bytes",
    "free_bytes",
    "largest_free_bytes",
    "free_blocks",
    "live_allocations",
    "allocations_total",
    "failed_allocations",
    "refused_frees",
    "wrong_device_allocations",
)


class _CStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in _STAT_FIELDS]


@dataclass(frozen=True, slots=True)
class ArenaStats:
    """An arena's bookkeeping at one moment."""

    size_bytes: int  # the range it hands out (after alignment)
    in_use_bytes: int  # handed out and not freed (each piece rounded up to the alignment)
    peak_bytes: int  # the most in use at once
    free_bytes: int
    largest_free_bytes: int  # the biggest request that would fit now
    free_blocks: int  # free pieces (more of them for the same free bytes: fragmentation)
    live_allocations: int
    allocations_total: int
    failed_allocations: int  # requests that got NULL (full, or another GPU's)
    refused_frees: int  # frees of addresses it never gave out (or freed twice)
    wrong_device_allocations: int  # torch asked on another GPU than the region's


class Shim:
    """The loaded shim library, its functions typed for ctypes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        self._lib = lib
        arena_p = ctypes.c_void_p
        lib.modelswap_arena_create.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
        lib.modelswap_arena_create.restype = arena_p
        lib.modelswap_arena_destroy.argtypes = [arena_p]
        lib.modelswap_arena_destroy.restype = ctypes.c_int
        lib.modelswap_arena_alloc.argtypes = [arena_p, ctypes.c_size_t]
        lib.modelswap_arena_alloc.restype = ctypes.c_void_p
        lib.modelswap_arena_free.argtypes = [arena_p, ctypes.c_void_p, ctypes.c_size_t]
        lib.modelswap_arena_free.restype = ctypes.c_int
        lib.modelswap_arena_stats.argtypes = [arena_p, ctypes.POINTER(_CStats)]
        lib.modelswap_arena_stats.restype = ctypes.c_int
        lib.modelswap_arena_base.argtypes = [arena_p]
        lib.modelswap_arena_base.restype = ctypes.c_size_t
        lib.modelswap_arena_size.argtypes = [arena_p]
        lib.modelswap_arena_size.restype = ctypes.c_size_t
        lib.modelswap_slot_bind.argtypes = [ctypes.c_int, arena_p]
        lib.modelswap_slot_bind.restype = ctypes.c_int
        lib.modelswap_slot_arena.argtypes = [ctypes.c_int]
        lib.modelswap_slot_arena.restype = arena_p
        self.alignment_bytes = int(lib.modelswap_alignment_bytes())
        self.slot_count = int(lib.modelswap_slot_count())
        self._slot_lock = threading.Lock()

    @property
    def lib(self) -> Any:
        return self._lib

    def entry_points(self, slot: int) -> tuple[str, str]:
        """The alloc and free functions torch calls for `slot`."""
        return f"modelswap_alloc_{slot}", f"modelswap_free_{slot}"

    def slot_function(self, name: str) -> Any:
        """An entry point as a ctypes function with torch's signature (tests call these)."""
        fn = getattr(self._lib, name)
        if name.startswith("modelswap_alloc_"):
            fn.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            fn.restype = ctypes.c_void_p
        else:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            fn.restype = None
        return fn

    def bind(self, arena_pointer: int) -> int:
        """Bind an arena to the first free slot, for the life of the process."""
        with self._slot_lock:
            for slot in range(self.slot_count):
                if self._lib.modelswap_slot_bind(slot, arena_pointer) == 0:
                    return slot
        raise ClientError(
            f"the allocation shim's {self.slot_count} slots are all bound: at most "
            f"{self.slot_count} regions per process can take allocations"
        )


_shim: Shim | None = None
_shim_lock = threading.Lock()


def load_shim() -> Shim:
    """The shim, loaded once per process; built first when it is missing (`native_build`)."""
    global _shim  # noqa: PLW0603 - one loaded library per process
    with _shim_lock:
        if _shim is None:
            _shim = Shim(native_build.ensure_library())
        return _shim


class Arena:
    """Bookkeeping of pieces of [base, base + size): no memory is read or written.

    `allocate` returns an address (0 when nothing that large is free); `free` takes it
    back (False, counted in `refused_frees`, for an address it never gave out)."""

    def __init__(
        self, base_address: int, size_bytes: int, *, device: int = 0, shim: Shim | None = None
    ) -> None:
        self._shim = shim or load_shim()
        self._pointer: int | None = None
        self.slot: int | None = None
        self.device = device
        pointer = self._shim.lib.modelswap_arena_create(base_address, size_bytes, device)
        if not pointer:
            raise ClientError(
                f"no arena fits in {size_bytes} bytes at {base_address:#x} "
                f"(aligned to {self._shim.alignment_bytes} bytes)"
            )
        self._pointer = int(pointer)
        self.base_address = int(self._shim.lib.modelswap_arena_base(pointer))
        self.size_bytes = int(self._shim.lib.modelswap_arena_size(pointer))

    @property
    def pointer(self) -> int:
        if self._pointer is None:
            raise ClientError("the arena is closed")
        return self._pointer

    def contains(self, address: int) -> bool:
        return self.base_address <= address < self.base_address + self.size_bytes

    def allocate(self, size_bytes: int) -> int:
        return int(self._shim.lib.modelswap_arena_alloc(self.pointer, size_bytes) or 0)

    def free(self, address: int, size_bytes: int = 0) -> bool:
        return int(self._shim.lib.modelswap_arena_free(self.pointer, address, size_bytes)) == 0

    def stats(self) -> ArenaStats:
        out = _CStats()
        self._shim.lib.modelswap_arena_stats(self.pointer, ctypes.byref(out))
        return ArenaStats(**{name: int(getattr(out, name)) for name in _STAT_FIELDS})

    def bind(self) -> int:
        """Bind to a slot of the shim (once, for good); returns the slot."""
        if self.slot is None:
            self.slot = self._shim.bind(self.pointer)
        return self.slot

    def close(self) -> None:
        """Free the bookkeeping. Refused while pieces are allocated or once bound to a slot
        (torch may still call into a bound arena)."""
        if self._pointer is None:
            return
        if self.slot is not None:
            raise ClientError(f"arena bound to slot {self.slot} lives as long as the process")
        if self._shim.lib.modelswap_arena_destroy(self._pointer) != 0:
            raise ClientError("the arena still has allocations; free them first")
        self._pointer = None


def _import_torch() -> Any:
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    except ImportError as e:
        raise ClientError(
            "the allocation route needs torch with CUDA in the model process's environment"
        ) from e
    if not torch.cuda.is_available():
        raise ClientError("the allocation route needs torch with CUDA and a visible GPU")
    return torch


class RegionPool:
    """A torch `MemPool` that places allocations in `region` (GPU memory)."""

    def __init__(self, region: Region, *, shim: Shim | None = None) -> None:
        if not region.on_device:
            raise ClientError(
                f"region {region.tag} is host memory: the allocation route needs a GPU "
                "backend (cuda-vmm or managed); on the sim backend use "
                "modelswap_client.torch.adopt"
            )
        torch = _import_torch()
        self.region = region
        self.shim = shim or load_shim()
        self.arena = Arena(
            region.address, region.size_bytes, device=region.device_ordinal, shim=self.shim
        )
        alloc_name, free_name = self.shim.entry_points(self.arena.bind())
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            str(self.shim.path), alloc_name, free_name
        )
        self._allocator = allocator  # torch's pool refers to it; keep it alive with us
        self.pool = torch.cuda.memory.MemPool(allocator.allocator())
        self._torch = torch

    @property
    def device(self) -> int:
        return self.region.device_ordinal

    @contextlib.contextmanager
    def use(self) -> Iterator[RegionPool]:
        """Route this thread's allocations on the region's GPU (made the current device
        for the body, so `.cuda()` lands there) into the region."""
        torch = self._torch
        with (
            torch.cuda.device(self.device),
            torch.cuda.memory.use_mem_pool(self.pool, device=self.device),
        ):
            yield self

    def stats(self) -> ArenaStats:
        return self.arena.stats()

    def contains(self, address: int) -> bool:
        return self.arena.contains(address)


class _Attached(Protocol):
    """What `allocations` needs of an `Attachment`."""

    @property
    def regions(self) -> dict[str, Region]: ...

    def in_use(
        self, timeout_seconds: float | None = None
    ) -> contextlib.AbstractContextManager[None]: ...


_pools: weakref.WeakKeyDictionary[Any, dict[str, RegionPool]] = weakref.WeakKeyDictionary()
_pools_lock = threading.Lock()


def region_pool(attachment: _Attached, tag: str) -> RegionPool:
    """The attachment's pool for region `tag`, made on first use and kept with it."""
    try:
        region = attachment.regions[tag]
    except KeyError:
        raise ClientError(f"no region {tag!r}: attached {sorted(attachment.regions)}") from None
    with _pools_lock:
        by_tag = _pools.setdefault(attachment, {})
        pool = by_tag.get(tag)
        if pool is None:
            pool = by_tag[tag] = RegionPool(region)
        return pool


def allocations(
    attachment: _Attached, tag: str = "weights"
) -> contextlib.AbstractContextManager[RegionPool]:
    """A context that routes this thread's CUDA allocations into region `tag`, the model
    held resident meanwhile; it yields the pool (`stats()`, `contains(address)`). The pool
    is made now, so a missing region, torch or shim raises here, not at `with`.

    Do not enter it inside `in_use()`: a swap-out that starts between the two waits for
    the outer `in_use()` to end, and this one waits for that swap-out until it times out.
    """
    pool = region_pool(attachment, tag)
    return _routed(attachment, pool)


@contextlib.contextmanager
def _routed(attachment: _Attached, pool: RegionPool) -> Iterator[RegionPool]:
    with attachment.in_use(), pool.use():
        yield pool
