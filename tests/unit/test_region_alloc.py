"""The allocation shim (`_region_alloc.c`) through ctypes, on the CPU: its arenas are
bookkeeping over made-up address ranges (nothing is read or written there), so every rule
a torch MemPool relies on is checked here: 512-byte alignment, NULL when full, coalescing,
best fit under fragmentation, many threads at once, independent arenas, refused frees, the
per-slot entry points torch calls. Also the build (`native_build`) and the refusal of the
allocation route on the sim backend (a real in-process agent)."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import sys
import tempfile
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelswap_api.wire import KvMode, RegionKind
from modelswap_client import allocation, native_build
from modelswap_client.allocation import Arena, RegionPool, Shim, load_shim
from modelswap_client.client import ClientError, Region, RegionSpec, attach
from modelswap_sidecar.allocators.sim import SimAllocator
from modelswap_sidecar.engine.core import Engine, EngineSettings
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import ModelConfig
from modelswap_sidecar.engine.server import EngineServer
from modelswap_sidecar.engine.vouching import RegisteredVoucher

KIB = 1 << 10
MIB = 1 << 20
# A made-up, 2 MiB aligned address far from anything mapped: the shim never touches it.
BASE = 0x7A0000000000


@pytest.fixture(scope="module")
def shim() -> Shim:
    return load_shim()


def arena(shim: Shim, size: int, base: int = BASE, device: int = 0) -> Arena:
    return Arena(base, size, device=device, shim=shim)


def test_pieces_are_512_byte_aligned_and_rounded_up(shim: Shim) -> None:
    a = arena(shim, 64 * KIB)
    sizes = [1, 511, 512, 513, 1000, 4096, 7]
    pieces = [a.allocate(n) for n in sizes]
    assert all(p % 512 == 0 for p in pieces)
    assert all(a.contains(p) for p in pieces)
    rounded = [-(-n // 512) * 512 for n in sizes]
    spans = sorted(zip(pieces, rounded, strict=True))
    for (p, n), (q, _) in itertools.pairwise(spans):
        assert p + n <= q, "pieces overlap"
    s = a.stats()
    assert s.in_use_bytes == sum(rounded) and s.live_allocations == len(sizes)
    assert a.allocate(0) == 0 and a.stats().failed_allocations == 0, "0 bytes: NULL, no failure"


def test_an_unaligned_range_is_trimmed_inwards(shim: Shim) -> None:
    a = arena(shim, 8 * KIB, base=BASE + 100)
    assert a.base_address == BASE + 512
    assert a.size_bytes == 15 * 512  # 8 KiB - 412 bytes = 7,780, rounded down to 512
    assert a.allocate(15 * 512) == BASE + 512
    assert a.allocate(1) == 0
    with pytest.raises(ClientError, match="no arena fits"):
        arena(shim, 400, base=BASE + 1)


def test_full_arena_returns_null_and_counts_it(shim: Shim) -> None:
    a = arena(shim, 4 * KIB)
    first = a.allocate(3 * KIB)
    assert first == BASE
    assert a.allocate(2 * KIB) == 0, "only 1 KiB is left"
    s = a.stats()
    assert s.failed_allocations == 1 and s.in_use_bytes == 3 * KIB
    assert s.largest_free_bytes == 1 * KIB
    assert a.allocate(1 * KIB) == BASE + 3 * KIB
    assert a.allocate(1) == 0 and a.stats().failed_allocations == 2
    assert a.free(first)
    assert a.allocate(2 * KIB) == BASE, "the freed space is used again"


def test_frees_coalesce_with_both_neighbours(shim: Shim) -> None:
    a = arena(shim, 3 * KIB)
    x, y, z = (a.allocate(KIB) for _ in range(3))
    assert a.stats().free_blocks == 0
    assert a.free(x) and a.free(z)
    s = a.stats()
    assert (s.free_blocks, s.free_bytes, s.largest_free_bytes) == (2, 2 * KIB, KIB)
    assert a.allocate(2 * KIB) == 0, "two separate 1 KiB holes do not make 2 KiB"
    assert a.free(y)
    s = a.stats()
    assert (s.free_blocks, s.largest_free_bytes, s.in_use_bytes) == (1, 3 * KIB, 0)
    assert a.allocate(3 * KIB) == BASE, "all three merged into one block"


def test_fragmentation_and_best_fit(shim: Shim) -> None:
    a = arena(shim, 16 * KIB)
    pieces = [a.allocate(KIB) for _ in range(16)]
    for p in pieces[::2]:  # every other one: 8 KiB free in 1 KiB holes
        assert a.free(p)
    s = a.stats()
    assert (s.free_bytes, s.largest_free_bytes, s.free_blocks) == (8 * KIB, KIB, 8)
    assert a.allocate(2 * KIB) == 0
    # open a 3 KiB hole at pieces[2..4]; a 1 KiB request must still take a 1 KiB hole
    assert a.free(pieces[3])
    assert a.stats().largest_free_bytes == 3 * KIB
    small = a.allocate(KIB)
    assert small == pieces[0], "best fit: the lowest exact-size hole, not the 3 KiB one"
    big = a.allocate(3 * KIB)
    assert big == pieces[2]
    assert a.stats().peak_bytes == 16 * KIB


def test_freeing_what_it_never_gave_out_is_refused_and_counted(shim: Shim) -> None:
    a = arena(shim, 8 * KIB)
    p = a.allocate(2 * KIB)
    before = a.stats()
    assert not a.free(BASE + 64 * KIB), "outside the arena"
    assert not a.free(BASE - 512), "below the arena"
    assert not a.free(p + 512), "inside a piece, not its start"
    assert not a.free(BASE + 4 * KIB), "the start of free space"
    after = a.stats()
    assert after.refused_frees == before.refused_frees + 4
    assert (after.in_use_bytes, after.live_allocations) == (2 * KIB, 1), "nothing changed"
    assert a.free(p)
    assert not a.free(p), "a second free of the same piece"
    assert a.stats().refused_frees == before.refused_frees + 5
    assert a.free(0), "NULL is a no-op, as for free(3)"
    assert a.stats().refused_frees == before.refused_frees + 5


def test_two_arenas_are_independent(shim: Shim) -> None:
    a = arena(shim, 4 * KIB)
    b = arena(shim, 4 * KIB, base=BASE + 1 * MIB, device=1)
    pa = a.allocate(4 * KIB)
    assert a.allocate(1) == 0
    pb = b.allocate(4 * KIB)
    assert pb == BASE + 1 * MIB, "b is unaffected by a being full"
    assert not b.free(pa), "a's piece is not b's to free"
    assert b.stats().refused_frees == 1 and a.stats().refused_frees == 0
    assert a.free(pa)
    assert a.stats().in_use_bytes == 0 and b.stats().in_use_bytes == 4 * KIB


def test_many_threads_never_get_overlapping_pieces(shim: Shim) -> None:
    size = 4 * MIB
    a = arena(shim, size)
    live: dict[int, int] = {}  # address -> rounded size, of pieces known to be handed out
    lock = threading.Lock()
    errors: list[str] = []
    nulls = [0]
    start = threading.Barrier(8)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        mine: list[int] = []
        start.wait()
        for _ in range(3000):
            if mine and (rng.random() < 0.45 or len(mine) > 40):
                p = mine.pop(rng.randrange(len(mine)))
                with lock:
                    del live[p]  # out of the set before the arena may hand it out again
                if not a.free(p):
                    errors.append(f"free of {p:#x} refused")
                continue
            n = rng.choice([1, 100, 512, 600, 4 * KIB, 40 * KIB, 200 * KIB])
            p = a.allocate(n)
            if p == 0:
                with lock:
                    nulls[0] += 1
                continue
            rounded = -(-n // 512) * 512
            with lock:
                for q, m in live.items():
                    if p < q + m and q < p + rounded:
                        errors.append(f"{p:#x}+{rounded} overlaps {q:#x}+{m}")
                live[p] = rounded
            mine.append(p)
        for p in mine:
            with lock:
                del live[p]
            a.free(p)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    s = a.stats()
    assert (s.in_use_bytes, s.live_allocations, s.refused_frees) == (0, 0, 0)
    assert (s.free_blocks, s.largest_free_bytes) == (1, size), "everything coalesced back"
    assert s.failed_allocations == nulls[0]
    assert s.allocations_total > 8000 and 0 < s.peak_bytes <= size


def test_closing_refuses_while_pieces_are_out(shim: Shim) -> None:
    a = arena(shim, 4 * KIB)
    p = a.allocate(KIB)
    with pytest.raises(ClientError, match="still has allocations"):
        a.close()
    assert a.free(p)
    a.close()
    with pytest.raises(ClientError, match="closed"):
        a.allocate(KIB)


def test_slot_entry_points_have_torchs_signatures(shim: Shim) -> None:
    a = arena(shim, 8 * KIB, base=BASE + 2 * MIB, device=1)
    slot = a.bind()
    assert a.bind() == slot, "bound once"
    alloc_name, free_name = shim.entry_points(slot)
    alloc, free = shim.slot_function(alloc_name), shim.slot_function(free_name)
    p = alloc(1000, 1, None)
    assert p == BASE + 2 * MIB and a.stats().in_use_bytes == 1024
    assert alloc(1000, 0, None) is None, "another GPU than the region's: NULL"
    assert alloc(-5, 1, None) is None
    s = a.stats()
    assert (s.wrong_device_allocations, s.failed_allocations) == (1, 1)
    free(p, 1000, 1, None)
    free(p, 1000, 1, None)  # torch never does this; the arena refuses it
    s = a.stats()
    assert (s.in_use_bytes, s.refused_frees) == (0, 1)
    with pytest.raises(ClientError, match="lives as long as the process"):
        a.close()
    other = arena(shim, 4 * KIB)
    assert other.bind() != slot


def test_an_unbound_slot_allocates_nothing(shim: Shim) -> None:
    free_slots = [n for n in range(shim.slot_count) if not shim.lib.modelswap_slot_arena(n)]
    assert free_slots, "every slot is bound in this process"
    alloc_name, free_name = shim.entry_points(free_slots[-1])
    assert shim.slot_function(alloc_name)(4096, 0, None) is None
    shim.slot_function(free_name)(BASE, 4096, 0, None)  # ignored, no crash


# -- the build ------------------------------------------------------------------------------


def test_build_writes_a_loadable_library_named_by_the_source(tmp_path: Path) -> None:
    out = native_build.build(tmp_path / "native")
    assert out.parent == tmp_path / "native"
    assert out.name == native_build.library_name()
    assert not list(out.parent.glob(".*partial")), "no temporary file left behind"
    shim = Shim(out)
    assert shim.alignment_bytes == 512 and shim.slot_count == 64
    changed = tmp_path / "changed.c"
    changed.write_bytes(native_build.SOURCE.read_bytes() + b"\n/* changed */\n")
    assert native_build.library_name(changed) != out.name, "a new source gets a new name"
    mtime = out.stat().st_mtime_ns
    assert native_build.build(tmp_path / "native") == out
    assert out.stat().st_mtime_ns == mtime, "an existing build is reused"


def test_build_without_a_compiler_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ClientError, match=r"no C compiler was found .*\$CC, cc, gcc, clang"):
        native_build.build(tmp_path / "native")
    assert native_build.main(["--out-dir", str(tmp_path / "native")]) == 1


def test_a_failing_compiler_is_reported_with_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "fakecc"
    fake.write_text("#!/bin/sh\necho 'fakecc: no such luck' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(ClientError, match=r"exited 3\): fakecc: no such luck"):
        native_build.build(tmp_path / "native", force=True)
    assert not list((tmp_path / "native").iterdir()), "nothing half-built is left"


def test_the_library_is_found_in_the_configured_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(native_build.NATIVE_DIR_ENV, str(tmp_path / "img"))
    assert native_build.search_dirs()[0] == tmp_path / "img"
    built = native_build.build()
    assert built.parent == tmp_path / "img"
    assert native_build.find_library() == built


def test_the_cli_prints_the_library_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert native_build.main(["--out-dir", str(tmp_path)]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed.parent == tmp_path and printed.is_file()


def test_no_compiler_is_needed_once_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = native_build.build(tmp_path)
    monkeypatch.setenv(native_build.NATIVE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CC", raising=False)
    assert native_build.ensure_library() == built
    assert shutil.which("cc") is None


# -- the route's refusals ---------------------------------------------------------------------


def gpu_region(on_device: bool = True) -> Region:
    return Region(
        "weights", RegionKind.WEIGHTS, 4 * MIB, 4 * MIB, BASE, on_device=on_device,
        host_accessible=not on_device,
    )  # fmt: skip


def test_a_pool_needs_torch_with_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(ClientError, match="needs torch with CUDA in the model process"):
        RegionPool(gpu_region())
    cpu_torch = types.ModuleType("torch")
    cpu_torch.cuda = types.SimpleNamespace(is_available=lambda: False)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", cpu_torch)
    with pytest.raises(ClientError, match="needs torch with CUDA and a visible GPU"):
        RegionPool(gpu_region())


def test_a_pool_refuses_host_memory() -> None:
    with pytest.raises(ClientError, match=r"region weights is host memory.*GPU backend"):
        RegionPool(gpu_region(on_device=False))


def test_allocations_names_a_missing_region() -> None:
    attached = types.SimpleNamespace(regions={"weights": gpu_region()})
    with pytest.raises(ClientError, match=r"no region 'kv': attached \['weights'\]"):
        allocation.allocations(attached, "kv")


# -- the route on the sim backend ---------------------------------------------------------------


@pytest.fixture
def sim_agent() -> Iterator[str]:
    """A real engine on the sim allocator in this process; yields its socket path."""
    with tempfile.TemporaryDirectory(prefix="ms-ra-") as workdir:
        allocator = SimAllocator(capacities_bytes=[64 * MIB], pool_chunk_bytes=32 * MIB)
        voucher = RegisteredVoucher()
        voucher.register(os.getpid(), "m")
        engine = Engine(
            allocator,
            HostStore(Path(workdir) / "store", {0: 64 * MIB}),
            voucher,
            EngineSettings(readopt_grace_seconds=1.0),
            decider=lambda name: engine.swap_in(name),  # noqa: PLW0108 - built by this call
        )
        engine.recover()
        engine.add_model(ModelConfig("m", 0, KvMode.DISCARD))
        server = EngineServer(engine, Path(workdir) / "agent.sock")
        server.start()
        try:
            yield str(Path(workdir) / "agent.sock")
        finally:
            server.close()
            engine.close()
            allocator.close()


def test_the_allocation_route_is_refused_on_the_sim_backend(sim_agent: str) -> None:
    att = attach("m", [RegionSpec("weights", 4 * MIB)], socket_path=sim_agent, timeout_seconds=30)
    try:
        with pytest.raises(ClientError, match=r"needs a GPU backend.*modelswap_client.torch.adopt"):
            att.allocations("weights")
        # the regions keep working: the refusal changed nothing
        with att.in_use():
            att.regions["weights"].view()[:4] = b"ok!!"
            assert bytes(att.regions["weights"].view()[:4]) == b"ok!!"
    finally:
        att.close()
