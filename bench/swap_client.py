"""The model process of `bench.swap`: attach one weights region, fill it, commit, wait.

On stdin EOF it prints the region's sha256 (under in_use) so the bench checks the bytes
survived every cycle. An optional third argument paces the sim mapper's copies to that
many bytes per second (an emulated link; the bench reports such figures as scaled).
"""

from __future__ import annotations

import cProfile
import ctypes
import hashlib
import os
import pstats
import sys
import threading

from modelswap_client.client import RegionSpec, attach
from modelswap_client.mappers.base import get_mapper


def _profile_every_thread() -> list[cProfile.Profile]:
    """cProfile each thread the client library starts from now on (its swap handling runs
    on its own threads): the first profile event of a thread enables a profiler there."""
    profilers: list[cProfile.Profile] = []

    def hook(frame: object, event: str, arg: object) -> None:
        profiler = cProfile.Profile()
        profilers.append(profiler)
        profiler.enable()  # replaces this hook in this thread

    threading.setprofile(hook)  # type: ignore[arg-type]
    return profilers


def main() -> int:
    socket_path, size = sys.argv[1], int(sys.argv[2])
    pace = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    # optional: write the client threads' profile (pstats) here at exit
    profile_path = sys.argv[4] if len(sys.argv) > 4 else ""
    profilers = _profile_every_thread() if profile_path else []
    mapper = get_mapper("sim", bandwidth_bytes_per_second=pace)
    att = attach(
        "bench", [RegionSpec("w", size, "weights")], socket_path=socket_path, mapper=mapper
    )
    region = att.regions["w"]
    data = os.urandom(size)
    ctypes.memmove(region.address, data, size)
    att.commit()
    expected = hashlib.sha256(data).hexdigest()
    del data
    print("ready", flush=True)
    sys.stdin.read()
    with att.in_use():
        got = hashlib.sha256(ctypes.string_at(region.address, size)).hexdigest()
    print("ok" if got == expected else "CORRUPT", flush=True)
    att.close()
    if profilers:
        for p in profilers:
            p.disable()
        stats = pstats.Stats(profilers[0])
        for p in profilers[1:]:
            stats.add(p)
        stats.dump_stats(profile_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
