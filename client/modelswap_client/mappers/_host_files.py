"""mmap of host-store files at raw addresses for the CUDA mappers (ctypes; stdlib only).

Python's `mmap` cannot hand out the address of a read-only mapping, and pinning needs one,
so the CUDA mappers call libc directly. The sim mapper has its own helpers.
"""

from __future__ import annotations

import ctypes
import os

PROT_READ = 0x1
PROT_WRITE = 0x2
MAP_SHARED = 0x01
MAP_POPULATE = 0x8000
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_munmap = _libc.munmap
_munmap.restype = ctypes.c_int
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def map_file(fd: int, size_bytes: int, *, writable: bool) -> int:
    """`mmap(MAP_SHARED|MAP_POPULATE)` of `fd`, read-only unless `writable`; the address."""
    prot = PROT_READ | (PROT_WRITE if writable else 0)
    result = _mmap(None, size_bytes, prot, MAP_SHARED | MAP_POPULATE, fd, 0)
    if result is None or result == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap(fd {fd}, {size_bytes}): {os.strerror(err)}")
    address: int = result
    return address


def unmap_file(address: int, size_bytes: int) -> None:
    if _munmap(address, size_bytes) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"munmap({address:#x}, {size_bytes}): {os.strerror(err)}")
