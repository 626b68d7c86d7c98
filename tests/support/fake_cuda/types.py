# ruff: noqa: N801, N815 - mirrors the cuda.bindings names
"""Enums, structs and handle types of the fake `cuda.bindings` (names as the real ones).

Only the names modelswap uses exist. Enum values are the fake's own except `CUresult` /
`cudaError_t`, whose numbers match CUDA (the code under test compares them with ints).
"""

from __future__ import annotations

import enum


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_DEVICE = 101
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_ILLEGAL_ADDRESS = 700
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713
    CUDA_ERROR_NOT_SUPPORTED = 801
    CUDA_ERROR_UNKNOWN = 999


class cudaError_t(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorNotReady = 600
    cudaErrorUnknown = 999


class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40
    CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89
    CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES = 100
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103
    CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED = 113
    CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED = 99
    CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID = 134


class CUmemLocationType(enum.IntEnum):
    CU_MEM_LOCATION_TYPE_INVALID = 0
    CU_MEM_LOCATION_TYPE_DEVICE = 1
    CU_MEM_LOCATION_TYPE_HOST = 2
    CU_MEM_LOCATION_TYPE_HOST_NUMA = 3
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4


class CUmemAllocationType(enum.IntEnum):
    CU_MEM_ALLOCATION_TYPE_INVALID = 0
    CU_MEM_ALLOCATION_TYPE_PINNED = 1


class CUmemAllocationHandleType(enum.IntEnum):
    CU_MEM_HANDLE_TYPE_NONE = 0
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
    CU_MEM_HANDLE_TYPE_FABRIC = 8


class CUmemAccess_flags(enum.IntEnum):
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0
    CU_MEM_ACCESS_FLAGS_PROT_READ = 1
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class CUmemAllocationGranularity_flags(enum.IntEnum):
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1


class CUstream_flags(enum.IntEnum):
    CU_STREAM_DEFAULT = 0
    CU_STREAM_NON_BLOCKING = 1


class CUevent_flags(enum.IntEnum):
    CU_EVENT_DEFAULT = 0
    CU_EVENT_BLOCKING_SYNC = 1
    CU_EVENT_DISABLE_TIMING = 2


class CUmem_advise(enum.IntEnum):
    CU_MEM_ADVISE_SET_READ_MOSTLY = 1
    CU_MEM_ADVISE_SET_PREFERRED_LOCATION = 3
    CU_MEM_ADVISE_SET_ACCESSED_BY = 5


class cudaMemLocationType(enum.IntEnum):
    cudaMemLocationTypeInvalid = 0
    cudaMemLocationTypeDevice = 1
    cudaMemLocationTypeHost = 2


class cudaMemoryAdvise(enum.IntEnum):
    cudaMemAdviseSetReadMostly = 1
    cudaMemAdviseSetPreferredLocation = 3
    cudaMemAdviseUnsetPreferredLocation = 4
    cudaMemAdviseSetAccessedBy = 5


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class cudaDeviceAttr(enum.IntEnum):
    cudaDevAttrConcurrentManagedAccess = 89
    cudaDevAttrPageableMemoryAccessUsesHostPageTables = 100


class _Handle:
    """An opaque handle object that converts to int, as the bindings' handle classes do."""

    def __init__(self, value: int = 0) -> None:
        self._value = int(value)

    def __int__(self) -> int:
        return self._value

    def __index__(self) -> int:
        return self._value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and int(other) == self._value  # type: ignore[call-overload]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._value))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._value:#x}>"


class CUdevice(_Handle):
    pass


class CUdeviceptr(_Handle):
    pass


class CUcontext(_Handle):
    pass


class CUstream(_Handle):
    pass


class CUevent(_Handle):
    pass


class CUmemGenericAllocationHandle(_Handle):
    pass


class cudaStream_t(_Handle):
    pass


class cudaEvent_t(_Handle):
    pass


class CUuuid:
    def __init__(self, raw: bytes) -> None:
        self.bytes = raw


class CUmemLocation:
    def __init__(self) -> None:
        self.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_INVALID
        self.id = 0

    def __repr__(self) -> str:
        return f"CUmemLocation({self.type.name}, {self.id})"


class CUmemAllocationProp:
    def __init__(self) -> None:
        self.type = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_INVALID
        self.requestedHandleTypes = CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
        self.allocFlags = None
        self._location = CUmemLocation()

    @property
    def location(self) -> CUmemLocation:
        return self._location

    @location.setter
    def location(self, value: CUmemLocation) -> None:
        # the bindings copy a nested struct on assignment; mutate-in-place is the safe idiom
        self._location.type, self._location.id = value.type, value.id


class CUmemAccessDesc:
    def __init__(self) -> None:
        self.flags = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE
        self._location = CUmemLocation()

    @property
    def location(self) -> CUmemLocation:
        return self._location

    @location.setter
    def location(self, value: CUmemLocation) -> None:
        self._location.type, self._location.id = value.type, value.id


class cudaMemLocation:
    def __init__(self) -> None:
        self.type = cudaMemLocationType.cudaMemLocationTypeInvalid
        self.id = 0
