"""The link speed a sim GPU reports: a swap on the sim backend is a copy between host
memory regions, so its "link" is this host's memory-copy rate, measured once at start.

The figure goes to the SwapNode's status (`link.hostToDeviceGBps`/`deviceToHostGBps`),
rounded to two significant digits so the status does not change with every measurement
noise; a configured `gpus[].linkGBps` wins over the measurement.
"""

from __future__ import annotations

import math
import mmap
import statistics
import time

DEFAULT_BYTES = 16 << 20
DEFAULT_REPEATS = 3


def round_gbps(gbps: float) -> float:
    """Two significant digits (17.34 → 17.0, 3.456 → 3.5)."""
    if gbps <= 0:
        return 0.0
    digits = 1 - math.floor(math.log10(gbps))
    return round(gbps, digits)


def measure_copy_gbps(size_bytes: int = DEFAULT_BYTES, repeats: int = DEFAULT_REPEATS) -> float:
    """Median rate of copying `size_bytes` between two anonymous mappings, in GB/s
    (10^9 bytes per second), rounded (`round_gbps`). Blocking: run it in a thread."""
    source = mmap.mmap(-1, size_bytes)
    target = mmap.mmap(-1, size_bytes)
    try:
        with memoryview(source) as src, memoryview(target) as dst:
            src[:] = b"\x5a" * size_bytes  # touch every page before timing
            dst[:] = src
            rates = []
            for _ in range(repeats):
                started = time.perf_counter()
                dst[:] = src
                elapsed = time.perf_counter() - started
                rates.append(size_bytes / max(elapsed, 1e-9) / 1e9)
        return round_gbps(statistics.median(rates))
    finally:
        source.close()
        target.close()
