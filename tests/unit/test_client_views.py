"""Region views: numpy/torch over host memory (sim), torch/cupy over GPU memory; the
optional libraries are imported only when a view is asked for."""

from __future__ import annotations

import ctypes

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


def test_torch_view_shares_the_region_memory_when_torch_is_installed() -> None:
    torch = pytest.importorskip("torch")
    buf = ctypes.create_string_buffer(64)
    t = host_region(buf).torch("int32")
    assert t.dtype == torch.int32 and t.numel() == 16
    t[0] = 7
    assert buf.raw[:4] == b"\x07\x00\x00\x00"


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
