"""The pieces of the benches that decide figures: the ceiling's means, the fixed-cost
line, the generated big model's checksum, and the stand-in client of the cold baseline."""

from __future__ import annotations

import importlib
import mmap
import os
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from bench import local_node, results_schema, swap
from examples.models import reference

pytestmark = pytest.mark.timeout(60)
MIB = 1 << 20


def test_the_ceiling_tries_every_thread_count_with_every_layout() -> None:
    assert swap.ceiling_means(2) == [
        (1, "whole"), (1, "chunks"), (1, "pipelined"), (2, "whole"), (2, "chunks"), (2, "pipelined")
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("threads", "layout"),
    [(1, "whole"), (2, "whole"), (2, "chunks"), (1, "pipelined"), (2, "pipelined")],
)
def test_every_ceiling_means_moves_the_bytes(threads: int, layout: str) -> None:
    size = 64 * MIB  # two engine chunks
    src = mmap.mmap(-1, size)
    src.write(os.urandom(size))
    base = np.frombuffer(src, dtype=np.uint8).ctypes.data
    seconds = swap.ceiling_seconds(base, size, threads, layout)
    assert 0 < seconds < 30


def test_fixed_cost_is_the_intercept_of_both_lines() -> None:
    rows = [
        results_schema.result(name, {"model_bytes": b}, [fixed + b / rate])
        for b in (64 * MIB, 256 * MIB, 1024 * MIB)
        for name, fixed, rate in (("swap_in", 0.002, 8e9), ("ceiling_copy", 0.0005, 7e9))
    ]
    row = swap.fixed_cost(rows)
    assert row is not None
    m = row["metrics"]
    assert m["swap_in_intercept_seconds"] == pytest.approx(0.002)
    assert m["ceiling_intercept_seconds"] == pytest.approx(0.0005)
    assert m["swap_in_marginal_bytes_per_second"] == pytest.approx(8e9)


def test_the_phase_clock_splits_a_swap_in_at_its_checkpoints() -> None:
    clock = swap.PhaseClock()
    clock.passed.update({"swap_in.allocated": 10.001, "swap_in.mapped": 10.003})
    assert clock.swap_in_phases(10.0, 10.010) == pytest.approx((0.001, 0.002, 0.007))
    with pytest.raises(RuntimeError, match="out of order"):
        clock.swap_in_phases(10.004, 10.010)  # checkpoints of an earlier swap-in


def test_a_miss_of_the_ceiling_says_where_the_time_went() -> None:
    phases = {
        "allocate_seconds": 0.0002,
        "map_round_trip_seconds": 0.001,
        "restore_round_trip_seconds": 0.0165,
        "client_copy_seconds": 0.0155,
    }
    by_means = {(1, "pipelined"): [0.016], (2, "pipelined"): [0.0146, 0.0150, 0.0140]}
    why = swap._why_short_of_ceiling(0.0177, phases, by_means, 0.013, "2 thread(s), chunks")
    assert "took 17.7 ms: allocating 0.2 ms, the map round trip 1.0 ms" in why
    assert "restore round trip 16.5 ms, of which the client granted access and copied" in why
    assert "(copy_2t_pipelined) took 14.6 ms" in why
    assert "(2 thread(s), chunks) 13.0 ms; 0.9 of the ceiling leaves 14.4 ms" in why


def test_the_big_model_carries_the_mlp_weights_and_its_sampled_checksum(tmp_path: Path) -> None:
    size = 4 * MIB + 4096
    folder = local_node.make_big_model(tmp_path, size)
    data = (folder / "1" / "weights.f32").read_bytes()
    assert len(data) == size
    mlp = (reference.MLP_DIR / "1" / "weights.f32").read_bytes()
    assert data == reference.tiled(mlp, size)
    pages, crc = size // 4096, 0
    for i in range(64):  # what bench/models/big/model.py computes
        p = (pages - 1) * i // 63
        crc = zlib.crc32(data[p * 4096 : (p + 1) * 4096], crc)
    assert local_node.big_checksum(size) == crc
    assert "weights_file" not in (folder / "config.pbtxt").read_text()


def test_the_stand_in_client_gives_process_memory_and_a_kv_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import modelswap_client

    monkeypatch.setenv("MODELSWAP_REAL_CLIENT", str(Path(modelswap_client.__file__).parent))
    monkeypatch.syspath_prepend(str(Path(local_node.__file__).parent / "standalone"))
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "modelswap_client"}
    for k in saved:
        del sys.modules[k]
    try:
        client = importlib.import_module("modelswap_client.client")
        assert "standalone" in str(client.__file__)
        att = client.attach("m", [client.RegionSpec("w", 2 * MIB), client.RegionSpec("kv", MIB)])
        assert not att.restored and not att.committed
        att.regions["w"].view()[:4] = b"abcd"
        assert bytes(att.regions["w"].numpy()[:4]) == b"abcd"
        att.commit()
        pool = att.kv_pool("kv", block_bytes=4096, tokens_per_block=16)
        assert len(pool.append_tokens("s", 40)) == 3
        pool.close()
        att.close()
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] == "modelswap_client"]:
            del sys.modules[k]
        sys.modules.update(saved)
