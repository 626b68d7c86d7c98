"""A developer's own process attaching as a dev model (local mode's dev loop), driven by
tests/integration/test_local_dev_loop.py over stdin/stdout, one JSON line per event.

    python dev_process.py MODEL REGION_BYTES SEED

It attaches with one weights region (through MODELSWAP_SOCKET, as a script or a notebook
would), fills it from SEED and commits unless the agent restored it, then answers `check`
(the region's CRC-32, read inside in_use(), which swaps the model in first when it is
out) and `quit` lines.
"""

import json
import random
import sys
import zlib

from modelswap_client.client import RegionSpec, attach
from modelswap_client.errors import ClientError


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


def main() -> int:
    model, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    try:
        att = attach(model, [RegionSpec("weights", size)])
    except ClientError as e:
        say(event="refused", code=str(e.code), message=str(e))
        return 3
    region = att.regions["weights"]
    if not att.restored:
        region.view()[:] = random.Random(seed).randbytes(size)
        att.commit()
    say(event="attached", restored=att.restored, crc=zlib.crc32(region.view()))
    for line in sys.stdin:
        command = line.strip()
        if command == "check":
            with att.in_use():
                crc = zlib.crc32(region.view())
            say(event="checked", crc=crc, state=str(att.state))
        elif command == "quit":
            break
    att.close()
    say(event="closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
