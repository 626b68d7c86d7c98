"""mmap of host-store files at raw addresses for the CUDA mappers (libc through `_libc`).

Python's `mmap` cannot hand out the address of a read-only mapping, and pinning needs one,
so the CUDA mappers call libc directly. The sim mapper calls `_libc` itself.
"""

from __future__ import annotations

import os

from modelswap_client import _libc


def map_file(fd: int, size_bytes: int, *, writable: bool) -> int:
    """`mmap(MAP_SHARED|MAP_POPULATE)` of `fd`, read-only unless `writable`; the address."""
    prot = _libc.PROT_READ | (_libc.PROT_WRITE if writable else 0)
    try:
        return _libc.mmap(0, size_bytes, prot, _libc.MAP_SHARED | _libc.MAP_POPULATE, fd)
    except OSError as e:
        err = e.errno or 0  # the message names the fd, as callers' logs always have
        raise OSError(err, f"mmap(fd {fd}, {size_bytes}): {os.strerror(err)}") from None


def unmap_file(address: int, size_bytes: int) -> None:
    _libc.munmap(address, size_bytes)
