"""Smoke run of the client library under another Python (a Triton stub's, e.g. 3.10).

Run as a script, standard library only: `python -I client_smoke.py CLIENT_DIR API_DIR`
(`-I` ignores PYTHONPATH, so the source folders come as arguments). Imports every module of
`modelswap_client` and `modelswap_api.wire`, checks that nothing outside the standard
library and those came with them, then does what a model process does first: a request
with an fd and its reply over a `SOCK_SEQPACKET` pair, and an error reply. Prints one JSON
line with what it saw; any failure is a traceback and a non-zero exit.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import socket
import sys
import threading


def main(client_dir: str, api_dir: str) -> None:
    before = set(sys.modules)  # what site loaded (e.g. setuptools' _distutils_hack)
    sys.path[:0] = [client_dir, api_dir]
    import modelswap_client
    from modelswap_api import wire

    modules = ["modelswap_api.wire"]
    for info in pkgutil.walk_packages(modelswap_client.__path__, "modelswap_client."):
        importlib.import_module(info.name)
        modules.append(info.name)
    ours = ("modelswap_client", "modelswap_api")
    foreign = sorted(
        name
        for name in set(sys.modules) - before
        if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] not in ours
    )
    if foreign:
        raise SystemExit(f"imported beyond the standard library: {foreign}")
    loaded_api = sorted(n for n in sys.modules if n.startswith("modelswap_api."))
    if loaded_api != ["modelswap_api.wire"]:
        raise SystemExit(f"the client imported more of modelswap_api than wire: {loaded_api}")

    from modelswap_client.kvpool import Tier

    def agent_handler(_peer: wire.Peer, request: wire.Message) -> wire.Message:
        if request.op is wire.Op.REGISTER:
            (fd,) = request.fds
            size = os.fstat(fd).st_size
            request.close_fds()
            return wire.reply_to(request, 3, {"epoch": 3, "saw_bytes": size})
        return wire.error_reply(request, 3, wire.ErrorCode.STALE, "epoch 2 is gone")

    client_sock, agent_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    closed = threading.Event()
    agent = wire.Peer(agent_sock, agent_handler, lambda _p: closed.set(), name="agent")
    client = wire.Peer(client_sock, lambda _p, r: wire.reply_to(r, 0), name="client")
    agent.start()
    client.start()
    fd = os.memfd_create("smoke")
    try:
        os.ftruncate(fd, 4096)
        body = {"model": "m", "instance": 0, "pid": os.getpid(), "version": 1}
        reply = client.request(wire.Op.REGISTER, body, fds=[fd], timeout_seconds=10)
    finally:
        os.close(fd)
    try:
        client.request(wire.Op.ATTACH, {"regions": []}, epoch=2, timeout_seconds=10)
        error = "no error"
    except wire.RemoteError as e:
        error = f"{e.code}|{e}"
    client.close()
    agent.close()
    print(
        json.dumps(
            {
                "python": list(sys.version_info[:2]),
                "modules": len(modules),
                "reply": reply.body,
                "error": error,
                "formatted": [str(wire.Op.SWAP_IN), f"{wire.ErrorCode.NO_CAPACITY}", f"{Tier.HBM}"],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
