"""The Mapper: the model process's side of GPU memory, one small interface for every backend.

A client reserves each model region's virtual address range once and maps physical chunks
the agent exports (as fds over `SCM_RIGHTS`) at the same addresses on every swap-in, so
pointers (and CUDA graphs) stay valid. Backends, loaded lazily by name through `get_mapper`:

- ``sim``: reserve is an anonymous `PROT_NONE` mapping; map is `mmap(MAP_SHARED|MAP_FIXED)`
  of the chunk's memfd with no access, and `set_access` maps it again in place with
  `MAP_POPULATE` and the granted protection; unmap maps anonymous
  `PROT_NONE|MAP_FIXED|MAP_NORESERVE` over the range; copies are real `memmove`s run on
  worker threads (optionally paced to a scaled link bandwidth).
- ``cuda-vmm``: `cuMemAddressReserve`, `cuMemImportFromShareableHandle` (then close the
  fd), `cuMemMap`, `cuMemSetAccess`, `cuMemcpyHtoDAsync`/`DtoHAsync` on the mapper's own
  non-blocking streams with events, `cuCtxSynchronize` + `cuMemUnmap` + `cuMemRelease`,
  readopt via `cuMemRetainAllocationHandle` + `cuMemExportToShareableHandle`. Own issue.
- ``managed``: `cudaMallocManaged` + prefetch (Grace, in-process only: it cannot import or
  export fds, `supports_fds` is False). Own issue.

Contract every backend keeps (the sim backend enforces it, so sim-tested code is
CUDA-shaped):

1. Addresses, sizes and offsets are multiples of `granularity_bytes()` (2 MiB).
2. `import_fd` CONSUMES the fd: it is closed before `import_fd` returns, also on error (an
   open fd pins the memory). The returned `Handle` keeps the memory alive until `release`.
   (The sim backend keeps a private dup inside the handle, used only by `export_fd`.)
3. `map` places `size_bytes` of a handle, from `offset_bytes`, at `address` inside a
   reservation, with NO access; `set_access` must follow before any use (CUDA's rule). A
   range may only be mapped where nothing is mapped.
4. `unmap(address, size_bytes)` takes exactly one whole mapping as it was mapped; unmapping
   part of a mapping, or a range spanning two, raises `MapperError`. Call `synchronize()`
   first: no copy may be in flight on a range being unmapped. After unmap a stray access to
   the range faults (sim: `SIGSEGV`; CUDA: an illegal-address error).
5. `release(handle)` needs the handle to be unmapped everywhere in this process.
6. Copies are asynchronous and return a `CopyEvent`; `stream` picks one of
   `stream_count()` independent in-order queues. `synchronize()` waits for all of them.
   `set_access_on_stream` may grant in a stream's order instead of at once: until its
   event is done, only copies queued after it on that stream may touch the range.
   Device addresses are mapped ranges with access set; host addresses come from
   `map_host` (pinned/registered for the CUDA backends).
7. `map_host(fd, size, writable=False)` maps a host-store file for copies; a read-only fd
   must be mapped read-only (CUDA: `CU_MEMHOSTREGISTER_READ_ONLY`). It does not consume fd.
8. Methods may be called from several threads; copies on one stream run in order.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20
#: CUDA's VMM granularity on current GPUs; the sim backend enforces the same.
GRANULARITY_BYTES = 2 * MIB


class MapperError(Exception):
    """A call that breaks the contract above, or a backend failure."""


class CopyError(MapperError):
    """An asynchronous copy failed; raised by `CopyEvent.wait`."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """A reserved virtual address range (`cuMemAddressReserve`), mapped into piecewise."""

    address: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Handle:
    """An imported physical chunk. `handle_id` is the backend's own key (opaque)."""

    handle_id: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class HostBuffer:
    """A host-store file mapped for copies (`mmap` + `cuMemHostRegister` for CUDA)."""

    address: int
    size_bytes: int
    writable: bool


class CopyEvent(abc.ABC):
    """Completion of one asynchronous copy (a CUDA event recorded after it)."""

    @abc.abstractmethod
    def query(self) -> bool:
        """True once the copy has finished (successfully or not)."""

    @abc.abstractmethod
    def wait(self, timeout_seconds: float | None = None) -> None:
        """Block until the copy finished; raise `CopyError` if it failed, TimeoutError on time."""


class _Finished(CopyEvent):
    """The event of work that was done before it was returned (a synchronous grant)."""

    def query(self) -> bool:
        return True

    def wait(self, timeout_seconds: float | None = None) -> None:
        return None


FINISHED: CopyEvent = _Finished()


class Mapper(abc.ABC):
    """Reserves, imports, maps and copies for the client library. See the module doc."""

    #: backend name, as passed to `get_mapper`
    name: str = ""
    #: False for `managed`: memory cannot come from (or go to) another process
    supports_fds: bool = True

    # -- what the memory it maps is (callers ask these, never the backend's name) --------

    @property
    @abc.abstractmethod
    def on_device(self) -> bool:
        """True: mapped memory is GPU memory (cuda-vmm, managed); False: host memory (sim)."""

    @property
    @abc.abstractmethod
    def host_accessible(self) -> bool:
        """True: the CPU may load and store mapped memory directly (sim; managed memory is
        unified); False: only copies and GPU kernels reach it (cuda-vmm)."""

    @property
    @abc.abstractmethod
    def device_ordinal(self) -> int:
        """This process's CUDA ordinal of the GPU holding mapped memory (0 for host memory)."""

    @abc.abstractmethod
    def granularity_bytes(self) -> int:
        """Addresses, sizes and offsets are multiples of this (2 MiB)."""

    @abc.abstractmethod
    def reserve(self, size_bytes: int) -> Reservation:
        """Reserve a granularity-aligned address range (inaccessible until mapped)."""

    @abc.abstractmethod
    def free_reservation(self, reservation: Reservation) -> None:
        """Give the range back; every mapping inside must have been unmapped."""

    @abc.abstractmethod
    def import_fd(self, fd: int, size_bytes: int) -> Handle:
        """Import a chunk exported by the agent. Consumes (closes) `fd` in every case."""

    @abc.abstractmethod
    def export_fd(self, handle: Handle) -> int:
        """A new fd for an imported chunk, for readopt; the caller sends and closes it."""

    @abc.abstractmethod
    def release(self, handle: Handle) -> None:
        """Drop the handle (`cuMemRelease`); it must not be mapped any more."""

    @abc.abstractmethod
    def map(self, address: int, size_bytes: int, handle: Handle, offset_bytes: int = 0) -> None:
        """Map `size_bytes` of `handle` from `offset_bytes` at `address`, with no access."""

    @abc.abstractmethod
    def set_access(self, address: int, size_bytes: int, *, writable: bool = True) -> None:
        """Grant read (and write) access to a mapped range (`cuMemSetAccess`)."""

    def set_access_on_stream(
        self, address: int, size_bytes: int, stream: int = 0, *, writable: bool = True
    ) -> CopyEvent:
        """Grant access in `stream`'s order: copies queued on `stream` after this call see
        the range accessible; anything else only once the returned event is done.

        CUDA's `cuMemSetAccess` is synchronous, so the default grants now and returns a
        finished event. The sim mapper queues the grant (its page-table population) on the
        stream, so grants of different chunks run in parallel with each other and with
        copies, as mapping and copying do on a machine's threads.
        """
        self.set_access(address, size_bytes, writable=writable)
        return FINISHED

    @abc.abstractmethod
    def unmap(self, address: int, size_bytes: int) -> None:
        """Unmap exactly one whole mapping. `synchronize()` first."""

    @abc.abstractmethod
    def map_host(self, fd: int, size_bytes: int, *, writable: bool = False) -> HostBuffer:
        """Map a host-store file for copies; `fd` stays the caller's."""

    @abc.abstractmethod
    def unmap_host(self, buffer: HostBuffer) -> None:
        """Unmap (and unregister) a host buffer; no copy may be in flight on it."""

    @abc.abstractmethod
    def stream_count(self) -> int:
        """How many independent copy streams `copy_*` may be given (at least 1)."""

    @abc.abstractmethod
    def copy_to_device(
        self, dst_address: int, src_address: int, size_bytes: int, stream: int = 0
    ) -> CopyEvent:
        """Queue a host→device copy (`cuMemcpyHtoDAsync`) and return its completion event."""

    @abc.abstractmethod
    def copy_to_host(
        self, dst_address: int, src_address: int, size_bytes: int, stream: int = 0
    ) -> CopyEvent:
        """Queue a device→host copy (`cuMemcpyDtoHAsync`) and return its completion event."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait for every queued copy (`cuCtxSynchronize`); raises `CopyError` on a failure."""

    def paced_bytes_per_second(self) -> float:
        """The emulated link bandwidth copies are paced to (sim only), or 0.0: copies run
        at this machine's own speed. Figures measured while paced are "scaled"."""
        return 0.0

    def pace(self, bandwidth_bytes_per_second: float) -> None:
        """Pace every later copy to an emulated link of this bandwidth (the agent's node
        setting, told at registration). Only the sim mapper can: a real link is not
        emulated, so every other mapper refuses."""
        raise MapperError(
            f"the {self.name} mapper cannot pace its copies "
            f"(asked for {bandwidth_bytes_per_second:.0f} B/s; pacing is a sim setting)"
        )

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Stop worker threads/streams. Mappings and reservations are the caller's to undo."""


MapperFactory = Callable[..., Mapper]

#: backend name → "module:factory"; modules are imported only when their backend is asked for.
_BACKENDS: dict[str, str] = {
    "sim": "modelswap_client.mappers.sim:SimMapper",
    "cuda-vmm": "modelswap_client.mappers.cuda_vmm:CudaVmmMapper",
    "managed": "modelswap_client.mappers.managed:ManagedMapper",
}


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def get_mapper(name: str, /, **options: Any) -> Mapper:
    """Build the mapper backend `name` ("sim" | "cuda-vmm" | "managed") with its options.

    The backend module is imported only here, so importing the client library never imports
    CUDA. Raises `MapperError` for an unknown name or a backend that cannot be imported.
    """
    try:
        target = _BACKENDS[name]
    except KeyError:
        raise MapperError(
            f"unknown mapper backend {name!r}; known: {', '.join(available_backends())}"
        ) from None
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise MapperError(f"mapper backend {name!r} cannot be loaded: {e}") from e
    factory: MapperFactory = getattr(module, attribute)
    return factory(**options)
