"""The sim allocator's pool and a readopt landing while the refill thread populates a
chunk (the flaky `test_agent_killed_mid_swap_clients_readopt`: 80 MiB of memfds held on a
64 MiB GPU after readopt). The chunk being populated is held by the process already, so
its room is reserved, and `wait_pool_full` waits for it."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import pytest

from modelswap_sidecar.allocators import sim
from modelswap_sidecar.allocators.base import Location
from modelswap_sidecar.allocators.sim import SimAllocator

MIB = 1 << 20
GPU0 = Location.device(0)


def held_bytes() -> int:
    """Bytes of the chunk memfds (the sim GPU's and the readopted one) this process holds
    an fd for, each inode once."""
    sizes: dict[int, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            name = os.readlink(f"/proc/self/fd/{fd}")
            if name.startswith(("/memfd:modelswap-sim-gpu0 ", "/memfd:a-client-chunk ")):
                st = os.stat(f"/proc/self/fd/{fd}")
                sizes[st.st_ino] = st.st_size
    return sum(sizes.values())


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """The refill thread's second chunk waits, populated, until `go` is set; `started`
    says it is being populated."""
    started, go = threading.Event(), threading.Event()
    real = sim._new_chunk_fd
    calls = 0

    def populate(ordinal: int, size_bytes: int) -> int:
        nonlocal calls
        calls += 1
        fd = real(ordinal, size_bytes)
        if calls == 2:
            started.set()
            go.wait(30)
        return fd

    monkeypatch.setattr(sim, "_new_chunk_fd", populate)
    yield started, go
    go.set()


def test_a_readopt_while_a_pool_chunk_is_populated_never_holds_past_capacity(
    gated: tuple[threading.Event, threading.Event],
) -> None:
    started, go = gated
    allocator = SimAllocator(capacities_bytes=[64 * MIB], pool_chunk_bytes=32 * MIB)
    adopted = os.memfd_create("a-client-chunk")
    try:
        assert started.wait(30), "the refill thread never populated a second chunk"
        # a restarted agent readopts 16 MiB a client still maps: one pool chunk plus the
        # one being populated plus these would be 80 MiB on a 64 MiB GPU
        os.ftruncate(adopted, 16 * MIB)
        chunk = allocator.adopt_fd(GPU0, adopted, 16 * MIB)
        assert held_bytes() <= 64 * MIB  # a pooled chunk gave way
        assert not allocator.wait_pool_full(0.2), "pool called full while a chunk populates"
        go.set()
        assert allocator.wait_pool_full(10)
        used = allocator.memory_info(GPU0).used_bytes
        assert used == 16 * MIB
        assert held_bytes() == used + allocator.pooled_bytes(GPU0)
        assert held_bytes() <= 64 * MIB
        allocator.release(chunk)
    finally:
        go.set()
        allocator.close()
        os.close(adopted)
