"""`python -m tests.support.kube_emulator [--port N] [--token T]`: serve until killed.

Prints one JSON line `{"url": …, "token": …}` on stdout once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys

from tests.support.kube_emulator.server import KubeEmulator


async def _serve(port: int, token: str | None) -> None:
    async with KubeEmulator(port=port, token=token) as api:
        sys.stdout.write(json.dumps({"url": api.url, "token": api.token}) + "\n")
        sys.stdout.flush()
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.kube_emulator")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default=None)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port, args.token))


if __name__ == "__main__":
    main()
