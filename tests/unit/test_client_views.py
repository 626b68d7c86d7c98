"""Region views: numpy/torch over host memory (sim), torch/cupy over GPU memory; the
optional libraries are imported only when a view is asked for."""

from __future__ import annotations

import ctypes
import sys
import types
from typing import Any

import numpy as np
import pytest

from modelswap_api.wire import RegionKind
from modelswap_client.client import ClientError, Region


def host_region(buf: ctypes.Array[ctypes.c_char]) -> Region:
    size = ctypes.sizeof(buf)
    return Region("w", RegionKind.WEIGHTS, size, size, ctypes.addressof(buf))


def test_numpy_view_shares_the_region_memory() -> None:
    buf = ctypes.create_string_buffer(64)
    arr = host_region(buf).numpy("<u4")
    arr[1] = 0x01020304
    assert buf.raw[4:8] == b"\x04\x03\x02\x01"


class _FakeTensor:
    """The two torch calls `Region.torch` makes, over numpy: enough to prove no copy."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def view(self, dtype: np.dtype[Any]) -> np.ndarray:
        return self.array.view(dtype)


def fake_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.uint8 = np.dtype("uint8")  # type: ignore[attr-defined]
    torch.int32 = np.dtype("int32")  # type: ignore[attr-defined]
    torch.frombuffer = lambda buffer, dtype: _FakeTensor(np.frombuffer(buffer, dtype=dtype))  # type: ignore[attr-defined]
    torch.from_dlpack = lambda view: ("dlpack", view)  # type: ignore[attr-defined]
    return torch


def test_torch_view_shares_the_region_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch is not installed here (it is no dependency); a stand-in checks the calls made.
    monkeypatch.setitem(sys.modules, "torch", fake_torch())
    buf = ctypes.create_string_buffer(64)
    t = host_region(buf).torch("int32")
    assert t.dtype == np.int32 and t.size == 16
    t[0] = 7
    assert buf.raw[:4] == b"\x07\x00\x00\x00"


def test_torch_view_of_gpu_memory_goes_through_dlpack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", fake_torch())
    device = Region("w", RegionKind.WEIGHTS, 4096, 4096, 0x7F0000000000, on_device=True)
    device.host_accessible = False
    kind, view = device.torch("float32")
    assert kind == "dlpack"
    assert view.__cuda_array_interface__["data"] == (0x7F0000000000, False)


def test_views_refuse_the_wrong_kind_of_memory() -> None:
    buf = ctypes.create_string_buffer(64)
    with pytest.raises(ClientError):
        host_region(buf).cupy()  # cupy arrays are GPU memory; the sim's is host memory
    device = Region("w", RegionKind.WEIGHTS, 64, 64, 0x7F0000000000, on_device=True)
    device.host_accessible = False
    with pytest.raises(ClientError):
        device.view()  # cuda-vmm memory: the CPU must not touch it


def test_gpu_region_views_describe_the_region_for_cuda_array_consumers() -> None:
    device = Region("w", RegionKind.WEIGHTS, 4096, 4096, 0x7F0000000000, on_device=True)
    device.host_accessible = False  # cuda-vmm memory
    device.device_ordinal = 1
    cai = device.cuda_view("float32").__cuda_array_interface__
    assert cai["data"] == (0x7F0000000000, False)
    assert cai["shape"] == (1024,) and cai["typestr"] == "<f4"
    assert device.cuda_view().__dlpack_device__() == (2, 1)  # kDLCUDA, GPU 1
