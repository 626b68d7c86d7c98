"""The model process of `bench.swap`: attach one weights region, fill it, commit, wait.

On stdin EOF it prints the region's sha256 (under in_use) so the bench checks the bytes
survived every cycle. An optional third argument paces the sim mapper's copies to that
many bytes per second (an emulated link; the bench reports such figures as scaled).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys

from modelswap_client.client import RegionSpec, attach
from modelswap_client.mappers.base import get_mapper


def main() -> int:
    socket_path, size = sys.argv[1], int(sys.argv[2])
    pace = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
