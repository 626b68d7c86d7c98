"""Zero-copy views of mapped GPU regions for PyTorch, CuPy, Numba and JAX.

`CudaView(address, size_bytes, device=…)` exposes a mapped region through the two
protocols GPU array libraries consume, without importing any of them:

- `__cuda_array_interface__` (version 3): `cupy.asarray(view)`, `numba.cuda.as_cuda_array`,
  `torch.as_tensor(view, device="cuda")`.
- DLPack (`__dlpack__` / `__dlpack_device__`): `torch.from_dlpack(view)`,
  `cupy.from_dlpack(view)`. The capsule is the classic unversioned ``dltensor`` one,
  which every consumer accepts; `max_version` is accepted and ignored.

The view does not own the memory: it stays valid while the region is mapped (between
swap-in and swap-out), and a tensor made from it must not outlive a swap-out — use the
client's `in_use()` around work that touches it. Addresses are stable across swaps, so a
view (and a CUDA graph captured over it) is valid again after the next swap-in.

Standard library only (ctypes).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

KDL_CUDA = 2
KDL_CUDA_MANAGED = 13

#: dtype name → (CUDA array interface typestr, DLPack type code, bits)
DTYPES: dict[str, tuple[str, int, int]] = {
    "uint8": ("|u1", 1, 8),
    "int8": ("|i1", 0, 8),
    "int16": ("<i2", 0, 16),
    "int32": ("<i4", 0, 32),
    "int64": ("<i8", 0, 64),
    "float16": ("<f2", 2, 16),
    "bfloat16": ("<V2", 4, 16),  # CAI has no bfloat16 typestr; DLPack does (kDLBfloat)
    "float32": ("<f4", 2, 32),
    "float64": ("<f8", 2, 64),
}


class DLDevice(ctypes.Structure):
    _fields_ = (("device_type", ctypes.c_int), ("device_id", ctypes.c_int))


class DLDataType(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class DLTensor(ctypes.Structure):
    _fields_ = (
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    )


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = (
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER),
)

_CAPSULE_NAME = b"dltensor"
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# private prototypes: ctypes.pythonapi's function objects are shared and mutable
_capsule_new = ctypes.PYFUNCTYPE(
    ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR
)(("PyCapsule_New", ctypes.pythonapi))
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)

# DLManagedTensor address → what keeps it (and its shape array) alive until the deleter runs
_alive: dict[int, tuple[DLManagedTensor, Any, CudaView]] = {}
_alive_lock = threading.Lock()


def live_exports() -> int:
    """DLPack tensors handed out and not yet deleted (for tests and leak checks)."""
    with _alive_lock:
        return len(_alive)


def _delete_tensor(managed: Any) -> None:
    with _alive_lock:
        _alive.pop(ctypes.addressof(managed.contents), None)


_delete = _DELETER(_delete_tensor)


def _destroy_unconsumed(capsule: int | None) -> None:
    # Unconsumed (still named "dltensor"): we own the tensor and delete it. A consumer
    # renames the capsule to "used_dltensor" and calls the deleter itself later.
    if capsule and _capsule_is_valid(capsule, _CAPSULE_NAME):
        pointer = _capsule_get_pointer(capsule, _CAPSULE_NAME)
        if pointer:
            _delete_tensor(ctypes.cast(pointer, ctypes.POINTER(DLManagedTensor)))


_destroy_capsule = _CAPSULE_DESTRUCTOR(_destroy_unconsumed)


class CudaView:
    """A typed, contiguous view of `size_bytes` at a device `address`. See the module doc."""

    def __init__(
        self,
        address: int,
        size_bytes: int,
        *,
        device: int,
        dtype: str = "uint8",
        shape: tuple[int, ...] | None = None,
        readonly: bool = False,
        managed: bool = False,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} not one of {sorted(DTYPES)}")
        itemsize = DTYPES[dtype][2] // 8
        if shape is None:
            if size_bytes % itemsize:
                raise ValueError(f"{size_bytes} bytes is not a whole number of {dtype}")
            shape = (size_bytes // itemsize,)
        count = 1
        for n in shape:
            count *= n
        if count * itemsize > size_bytes:
            raise ValueError(f"shape {shape} of {dtype} needs more than {size_bytes} bytes")
        self.address = address
        self.size_bytes = size_bytes
        self.device = device
        self.dtype = dtype
        self.shape = tuple(shape)
        self.readonly = readonly
        self.managed = managed

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "typestr": DTYPES[self.dtype][0],
            "data": (self.address, self.readonly),
            "version": 3,
            "strides": None,  # C-contiguous
            "stream": None,  # no synchronization needed: copies finished before swap-in returned
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA_MANAGED if self.managed else KDL_CUDA, self.device)

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A ``dltensor`` capsule over the region (no copy; `copy=True` is refused)."""
        if copy:
            raise BufferError("CudaView exports without copying; copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"cannot export to device {dl_device}")
        # `stream`: nothing to order against; our copies completed before the view was handed out
        _typestr, code, bits = DTYPES[self.dtype]
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        managed = DLManagedTensor()
        managed.dl_tensor.data = self.address
        device_type, device_id = self.__dlpack_device__()
        managed.dl_tensor.device = DLDevice(device_type, device_id)
        managed.dl_tensor.ndim = len(self.shape)
        managed.dl_tensor.dtype = DLDataType(code, bits, 1)
        managed.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        managed.dl_tensor.strides = ctypes.POINTER(ctypes.c_int64)()  # NULL: compact row-major
        managed.dl_tensor.byte_offset = 0
        managed.manager_ctx = None
        managed.deleter = _delete
        key = ctypes.addressof(managed)
        with _alive_lock:
            _alive[key] = (managed, shape, self)
        try:
            return _capsule_new(key, _CAPSULE_NAME, _destroy_capsule)
        except BaseException:
            with _alive_lock:
                _alive.pop(key, None)
            raise
