"""CUDA array interface and DLPack views of mapped regions (read back through ctypes)."""

from __future__ import annotations

import ctypes
import gc

import pytest

from modelswap_client import cuda_views
from modelswap_client.cuda_views import CudaView, DLManagedTensor

ADDRESS = 0x7F00_0020_0000
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_SetName", ctypes.pythonapi)
)


def test_cuda_array_interface_describes_the_region() -> None:
    view = CudaView(ADDRESS, 8 << 20, device=3, dtype="float16", shape=(1024, 2048))
    assert view.__cuda_array_interface__ == {
        "shape": (1024, 2048),
        "typestr": "<f2",
        "data": (ADDRESS, False),
        "version": 3,
        "strides": None,
        "stream": None,
    }
    assert CudaView(ADDRESS, 4096, device=0, readonly=True).__cuda_array_interface__["data"] == (
        ADDRESS,
        True,
    )
    with pytest.raises(ValueError, match="needs more than"):
        CudaView(ADDRESS, 100, device=0, dtype="float32", shape=(26,))


def test_dlpack_capsule_carries_pointer_shape_dtype_and_device() -> None:
    view = CudaView(ADDRESS, 64 << 20, device=1, dtype="bfloat16", shape=(4, 8))
    assert view.__dlpack_device__() == (2, 1)  # kDLCUDA
    before = cuda_views.live_exports()
    capsule = view.__dlpack__(stream=7, max_version=(1, 0))
    tensor = ctypes.cast(
        _get_pointer(capsule, b"dltensor"), ctypes.POINTER(DLManagedTensor)
    ).contents
    t = tensor.dl_tensor
    assert (t.data, t.ndim, t.byte_offset) == (ADDRESS, 2, 0)
    assert (t.device.device_type, t.device.device_id) == (2, 1)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (4, 16, 1)  # kDLBfloat
    assert [t.shape[i] for i in range(2)] == [4, 8]
    assert not t.strides
    assert cuda_views.live_exports() == before + 1
    del capsule, tensor, t
    gc.collect()
    assert cuda_views.live_exports() == before, "an unconsumed capsule deletes its tensor"


def test_a_consumed_capsule_is_deleted_by_its_consumer() -> None:
    view = CudaView(ADDRESS, 4096, device=0)
    before = cuda_views.live_exports()
    capsule = view.__dlpack__()
    pointer = _get_pointer(capsule, b"dltensor")
    assert _set_name(capsule, b"used_dltensor") == 0  # what torch/cupy do on import
    del capsule
    gc.collect()
    assert cuda_views.live_exports() == before + 1, "the consumer owns it now"
    managed = ctypes.cast(pointer, ctypes.POINTER(DLManagedTensor))
    managed.contents.deleter(managed)  # the consumer frees its tensor
    assert cuda_views.live_exports() == before


def test_copy_and_foreign_devices_are_refused() -> None:
    view = CudaView(ADDRESS, 4096, device=0, managed=True)
    assert view.__dlpack_device__() == (13, 0)  # kDLCUDAManaged
    with pytest.raises(BufferError):
        view.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        view.__dlpack__(dl_device=(1, 0))
