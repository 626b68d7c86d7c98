"""The one module that knows how cuda-bindings 12.x and 13.x differ, and how to call them.

Every CUDA backend (the agent's `cuda-vmm` allocator, the client's `cuda-vmm` and `managed`
mappers, the link probe) loads the bindings through `load()` and calls through the helpers
here, so the differences live in one place:

- Return convention (both majors): every call returns a tuple whose first item is the
  error code (`CUresult` / `cudaError_t`); `check()` raises `CudaError` on failure and
  returns the rest (None, the single value, or a tuple).
- `cuMemPrefetchAsync` / `cuMemAdvise` (driver) and `cudaMemPrefetchAsync` /
  `cudaMemAdvise` (runtime): 12.x take a device ordinal (`CU_DEVICE_CPU` /
  `cudaCpuDeviceId` = -1 for the host); 13.x take a `CUmemLocation` / `cudaMemLocation`
  and the prefetch calls gain a `flags` argument. `prefetch_async` / `mem_advise` and
  their runtime twins pick the right form.
- `cuDeviceGetUuid`: 12.x also has `cuDeviceGetUuid_v2` (the one that returns MIG UUIDs);
  13.x has only `cuDeviceGetUuid`, which now behaves like `_v2`. `device_uuid` prefers
  `_v2` where present.
- A machine without a driver: importing the bindings works, but `cuInit` raises (the
  bindings cannot load `libcuda.so.1`) or returns an error. `initialize()` turns both into
  `CudaUnavailable` with a message that says which, so the caller can log one clear line
  and select no CUDA backend.

`MODELSWAP_CUDA_WRAP=package.module:function` (unset in production) has `load()` hand the
binding modules through `function(driver, runtime) -> (driver, runtime)` before any backend
calls them: tests/support/cuda_recorder.py logs every call that way, on a GPU and on the
fake alike (tests/gpu/record_cycles.py). Unset, `load()` reads one environment variable.

Standard library only at import time; `cuda.bindings` is imported inside `load()`.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

#: CUresult / cudaError_t values this package reacts to (same numbers in 12.x and 13.x)
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_RT_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation
CUDA_RT_ERROR_NOT_READY = 600  # cudaErrorNotReady

#: names a `module:function` that wraps the binding modules at `load()` (call recording)
WRAP_ENV = "MODELSWAP_CUDA_WRAP"

#: `#define`s exposed as module attributes by the bindings; the numbers are the fallback
_DEFINES: dict[str, int] = {
    "CU_MEMHOSTREGISTER_PORTABLE": 0x01,
    "CU_MEMHOSTREGISTER_READ_ONLY": 0x08,
    "CU_DEVICE_CPU": -1,
    "cudaCpuDeviceId": -1,
    "cudaMemAttachGlobal": 0x01,
    "cudaStreamNonBlocking": 0x01,
    "cudaEventDisableTiming": 0x02,
    "cudaHostRegisterPortable": 0x01,
    "cudaHostRegisterReadOnly": 0x08,
}


class CudaUnavailable(RuntimeError):  # noqa: N818 - reads as the condition it is
    """No usable CUDA here: bindings missing, no driver, or no device."""


class CudaError(RuntimeError):
    """A CUDA call returned an error. `code` is the numeric value, `name` its symbol."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} failed: {name} ({code})")
        self.call = call
        self.code = code
        self.name = name

    @property
    def out_of_memory(self) -> bool:
        return self.code == CUDA_ERROR_OUT_OF_MEMORY


@dataclass(frozen=True, slots=True)
class Bindings:
    """The loaded binding modules and the major version their signatures follow."""

    driver: Any
    runtime: Any | None
    major: int
    version: str


_lock = threading.Lock()


def _bindings_version(package: ModuleType, driver: Any) -> tuple[int, str]:
    version = str(getattr(package, "__version__", "") or "")
    head = version.split(".", 1)[0]
    if head.isdigit():
        return int(head), version
    # No version string: 12.x has the `_v2` prefetch; 13.x renamed it to the plain name.
    major = 12 if hasattr(driver, "cuMemPrefetchAsync_v2") else 13
    return major, version or f"{major}.x (guessed)"


def load(*, runtime: bool = False) -> Bindings:
    """Import `cuda.bindings.driver` (and `.runtime` when asked). Raises `CudaUnavailable`."""
    with _lock:
        try:
            import cuda.bindings as package  # noqa: PLC0415 - CUDA is optional, loaded at use
            from cuda.bindings import driver  # noqa: PLC0415
        except ImportError as e:
            raise CudaUnavailable(f"cuda-bindings is not installed: {e}") from e
        rt: Any | None = None
        if runtime:
            try:
                from cuda.bindings import runtime as rt_module  # noqa: PLC0415
            except ImportError as e:
                raise CudaUnavailable(f"cuda.bindings.runtime cannot be imported: {e}") from e
            rt = rt_module
        major, version = _bindings_version(package, driver)
        if major not in (12, 13):
            log.warning(
                "cuda-bindings %s: only 12.x and 13.x are known; trying 13.x calls", version
            )
            major = 13
        driver, rt = _wrapped(driver, rt)
        return Bindings(driver=driver, runtime=rt, major=major, version=version)


def _wrapped(driver: Any, runtime: Any | None) -> tuple[Any, Any | None]:
    """The modules as `MODELSWAP_CUDA_WRAP`'s function returns them, or unchanged when unset.

    A set but broken value raises (never a silent fallback to unrecorded calls): whoever set
    it is recording and must not get a run that looks complete.
    """
    spec = os.environ.get(WRAP_ENV)
    if not spec:
        return driver, runtime
    module_name, _, attr = spec.partition(":")
    try:
        wrap = getattr(importlib.import_module(module_name), attr or "wrap")
    except (ImportError, AttributeError) as e:
        raise RuntimeError(f"{WRAP_ENV}={spec}: {e}") from e
    wrapped_driver, wrapped_runtime = wrap(driver, runtime)
    return wrapped_driver, wrapped_runtime


def error_name(b: Bindings, code: Any, *, runtime: bool = False) -> str:
    """The symbolic name of an error code, best effort (never raises)."""
    try:
        if runtime and b.runtime is not None:
            err, raw = b.runtime.cudaGetErrorName(code)
        else:
            err, raw = b.driver.cuGetErrorName(code)
        if int(err) == CUDA_SUCCESS and raw:
            return raw.decode() if isinstance(raw, bytes) else str(raw)
    except Exception:
        pass
    name = getattr(code, "name", None)
    return str(name) if name else f"error {int(code)}"


def check(b: Bindings, call: str, result: Any, *, runtime: bool = False) -> Any:
    """Unpack a bindings result tuple: raise `CudaError` on failure, else return the rest."""
    if not isinstance(result, tuple):  # a few calls return the bare code
        result = (result,)
    code = int(result[0])
    if code != CUDA_SUCCESS:
        raise CudaError(call, code, error_name(b, result[0], runtime=runtime))
    rest = result[1:]
    if not rest:
        return None
    if len(rest) == 1:
        return rest[0]
    return rest


def code_of(result: Any) -> int:
    """The numeric error code of a result tuple (for calls whose non-success is normal)."""
    return int(result[0] if isinstance(result, tuple) else result)


def define(module: Any, name: str) -> int:
    """A `#define` constant from a bindings module, with the documented value as fallback."""
    value = getattr(module, name, None)
    return int(value) if value is not None else _DEFINES[name]


def initialize(b: Bindings) -> None:
    """`cuInit(0)`; any failure (no libcuda, no device, driver error) → `CudaUnavailable`."""
    try:
        result = b.driver.cuInit(0)
    except Exception as e:  # the bindings raise when libcuda.so.1 cannot be loaded
        raise CudaUnavailable(f"no CUDA driver: cuInit raised {type(e).__name__}: {e}") from e
    code = code_of(result)
    if code != CUDA_SUCCESS:
        raise CudaUnavailable(
            f"CUDA driver present but unusable: cuInit returned {error_name(b, result[0])}"
        )


def as_int(value: Any) -> int:
    """The integer value of a pointer/handle object (`CUdeviceptr`, allocation handles)."""
    return int(value)


# --- structs --------------------------------------------------------------------------------


def _fill_location(b: Bindings, loc: Any, ordinal: int | None, numa_node: int | None) -> Any:
    """Fill a `CUmemLocation` in place (nested struct fields are mutated, never assigned)."""
    kinds = b.driver.CUmemLocationType
    if ordinal is not None:
        loc.type = kinds.CU_MEM_LOCATION_TYPE_DEVICE
        loc.id = ordinal
    elif numa_node is not None:
        loc.type = kinds.CU_MEM_LOCATION_TYPE_HOST_NUMA
        loc.id = numa_node
    else:
        loc.type = kinds.CU_MEM_LOCATION_TYPE_HOST
        loc.id = 0
    return loc


def device_location(b: Bindings, ordinal: int) -> Any:
    return _fill_location(b, b.driver.CUmemLocation(), ordinal, None)


def host_location(b: Bindings, numa_node: int | None = None) -> Any:
    """`HOST_NUMA` on `numa_node`, or plain `HOST` when None."""
    return _fill_location(b, b.driver.CUmemLocation(), None, numa_node)


def allocation_prop(
    b: Bindings, *, ordinal: int | None = None, numa_node: int | None = None
) -> Any:
    """Pinned allocation on GPU `ordinal` (or host NUMA node), exportable as a POSIX fd."""
    d = b.driver
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    _fill_location(b, prop.location, ordinal, numa_node)
    prop.requestedHandleTypes = posix_fd_handle_type(b)
    return prop


def posix_fd_handle_type(b: Bindings) -> Any:
    return b.driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def access_desc(b: Bindings, ordinal: int, *, writable: bool) -> Any:
    d = b.driver
    desc = d.CUmemAccessDesc()
    _fill_location(b, desc.location, ordinal, None)
    desc.flags = (
        d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        if writable
        else d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ
    )
    return desc


# --- calls whose signatures differ between 12.x and 13.x -------------------------------------


def device_uuid(b: Bindings, device: Any) -> str:
    """The GPU's UUID as NVML and `nvidia-smi -L` print it: ``GPU-xxxxxxxx-xxxx-…``."""
    fn = getattr(b.driver, "cuDeviceGetUuid_v2", None) or b.driver.cuDeviceGetUuid
    uuid = check(b, "cuDeviceGetUuid", fn(device))
    raw = bytes(uuid.bytes)
    if len(raw) != 16:
        raise CudaError("cuDeviceGetUuid", -1, f"unexpected UUID length {len(raw)}")
    h = raw.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def prefetch_async(b: Bindings, ptr: int, size: int, ordinal: int | None, stream: Any) -> None:
    """Driver prefetch of managed memory to GPU `ordinal`, or to the host when None."""
    d = b.driver
    if b.major >= 13:
        loc = device_location(b, ordinal) if ordinal is not None else host_location(b)
        check(b, "cuMemPrefetchAsync", d.cuMemPrefetchAsync(ptr, size, loc, 0, stream))
    else:
        target = ordinal if ordinal is not None else define(d, "CU_DEVICE_CPU")
        check(b, "cuMemPrefetchAsync", d.cuMemPrefetchAsync(ptr, size, target, stream))


def mem_advise(b: Bindings, ptr: int, size: int, advice: Any, ordinal: int | None) -> None:
    """Driver `cuMemAdvise` for GPU `ordinal`, or the host when None."""
    d = b.driver
    if b.major >= 13:
        loc = device_location(b, ordinal) if ordinal is not None else host_location(b)
        check(b, "cuMemAdvise", d.cuMemAdvise(ptr, size, advice, loc))
    else:
        target = ordinal if ordinal is not None else define(d, "CU_DEVICE_CPU")
        check(b, "cuMemAdvise", d.cuMemAdvise(ptr, size, advice, target))


def _rt_location(b: Bindings, ordinal: int | None) -> Any:
    rt = _runtime(b)
    loc = rt.cudaMemLocation()
    if ordinal is None:
        loc.type = rt.cudaMemLocationType.cudaMemLocationTypeHost
        loc.id = 0
    else:
        loc.type = rt.cudaMemLocationType.cudaMemLocationTypeDevice
        loc.id = ordinal
    return loc


def rt_prefetch_async(b: Bindings, ptr: int, size: int, ordinal: int | None, stream: Any) -> None:
    """Runtime `cudaMemPrefetchAsync` to GPU `ordinal`, or to the host when None."""
    rt = _runtime(b)
    if b.major >= 13:
        result = rt.cudaMemPrefetchAsync(ptr, size, _rt_location(b, ordinal), 0, stream)
    else:
        target = ordinal if ordinal is not None else define(rt, "cudaCpuDeviceId")
        result = rt.cudaMemPrefetchAsync(ptr, size, target, stream)
    check(b, "cudaMemPrefetchAsync", result, runtime=True)


def rt_mem_advise(b: Bindings, ptr: int, size: int, advice: Any, ordinal: int | None) -> None:
    """Runtime `cudaMemAdvise` for GPU `ordinal`, or the host when None."""
    rt = _runtime(b)
    if b.major >= 13:
        result = rt.cudaMemAdvise(ptr, size, advice, _rt_location(b, ordinal))
    else:
        target = ordinal if ordinal is not None else define(rt, "cudaCpuDeviceId")
        result = rt.cudaMemAdvise(ptr, size, advice, target)
    check(b, "cudaMemAdvise", result, runtime=True)


def _runtime(b: Bindings) -> Any:
    if b.runtime is None:
        raise CudaUnavailable("cuda.bindings.runtime was not loaded (load(runtime=True))")
    return b.runtime
