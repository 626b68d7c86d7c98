"""The few libc calls Python's `mmap` module cannot make (`MAP_FIXED`, raw addresses)."""

from __future__ import annotations

import ctypes
import os
import resource

PROT_NONE = 0x0
PROT_READ = 0x1
PROT_WRITE = 0x2
MAP_SHARED = 0x01
MAP_PRIVATE = 0x02
MAP_FIXED = 0x10
MAP_ANONYMOUS = 0x20
MAP_NORESERVE = 0x4000
MAP_POPULATE = 0x8000
MAP_FAILED = ctypes.c_void_p(-1).value
PR_SET_DUMPABLE = 4

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
_mprotect = _libc.mprotect
_mprotect.restype = ctypes.c_int
_mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mmap(  # noqa: PLR0917 - mirrors mmap(2)
    address: int, length: int, prot: int, flags: int, fd: int = -1, offset: int = 0
) -> int:
    result = _mmap(address or None, length, prot, flags, fd, offset)
    if result is None or result == MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap({address:#x}, {length}): {os.strerror(err)}")
    value: int = result
    if flags & MAP_FIXED and value != address:
        raise OSError(0, f"mmap placed {value:#x}, not {address:#x}")
    return value


def munmap(address: int, length: int) -> None:
    _check(_munmap(address, length), f"munmap({address:#x}, {length})")


def mprotect(address: int, length: int, prot: int) -> None:
    _check(_mprotect(address, length, prot), f"mprotect({address:#x}, {length})")


def memmove(dst: int, src: int, length: int) -> None:
    """Copy bytes between raw addresses (ctypes releases the GIL for the call)."""
    ctypes.memmove(dst, src, length)


def set_not_dumpable() -> None:
    """`prctl(PR_SET_DUMPABLE, 0)`: no core dumps, no ptrace or /proc/<pid>/mem by peers."""
    _check(_prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE, 0)")


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard
