"""`python -m tests.support.kube_emulator [--port N] [--token T] [--manifest PATH]...`.

Serves until killed, after creating the objects in each manifest (CRDs first, say).

Prints one JSON line `{"url": …, "token": …}` on stdout once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path

from tests.support.kube_emulator.server import KubeEmulator


async def _serve(port: int, token: str | None, manifests: list[Path]) -> None:
    async with KubeEmulator(port=port, token=token) as api:
        api.load_manifests(manifests)
        sys.stdout.write(json.dumps({"url": api.url, "token": api.token}) + "\n")
        sys.stdout.flush()
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.kube_emulator")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default=None)
    parser.add_argument("--manifest", type=Path, action="append", default=[])
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port, args.token, args.manifest))


if __name__ == "__main__":
    main()
