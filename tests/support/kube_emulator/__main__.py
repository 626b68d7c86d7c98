"""`python -m tests.support.kube_emulator [--port N] [--token T] [--tls] [--manifest PATH]...`.

Serves until killed, after creating the objects in each manifest (CRDs first, say).

Prints one JSON line `{"url": …, "token": …}` on stdout once it accepts connections (with
`"ca"`, the base64 PEM of its CA, under `--tls`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import sys
from pathlib import Path

from tests.support.kube_emulator.server import KubeEmulator


async def _serve(port: int, token: str | None, manifests: list[Path], tls: bool) -> None:
    async with KubeEmulator(port=port, token=token, tls=tls) as api:
        api.load_manifests(manifests)
        ready = {"url": api.url, "token": api.token}
        if api.ca_pem is not None:
            ready["ca"] = base64.b64encode(api.ca_pem).decode()
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.kube_emulator")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default=None)
    parser.add_argument("--manifest", type=Path, action="append", default=[])
    parser.add_argument(
        "--tls", action="store_true", help="HTTPS, authentication, RBAC, admission policies"
    )
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port, args.token, args.manifest, args.tls))


if __name__ == "__main__":
    main()
