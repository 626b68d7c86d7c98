"""The model process of the two-process GPU test: a cuda-vmm mapper driven over a socket.

Arguments: the GPU UUID and the fd number of a SOCK_SEQPACKET socket. Messages are JSON,
fds attached with SCM_RIGHTS:

    → {"op": "reserve", "bytes": N}                    ← {"address": A}
    → {"op": "map", "chunks": [{"offset", "bytes"}...], "host_bytes": N} + chunk fds + host fd
                                                       ← {"sha256": ..., "address": A}
    → {"op": "export"}      ← {"exported": [{"offset", "bytes"}...]} + fds, or {"error": ...}
    → {"op": "unmap"}                                  ← {"ok": true}
    → {"op": "exit"}

"map" imports and maps the chunks at the reservation's offsets, sets access, copies the
host file in, then reads the whole region back into a fresh staging memfd and hashes it.
"export" is the readopt after an agent restart: a new fd for the chunk mapped at each
mapping's address (`export_mapped_fd`). `serve()` is the loop, for a caller that runs it in
a thread (tests/gpu/record_cycles.py on the fake, which cannot span processes).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from typing import Any


def main() -> int:
    return serve(sys.argv[1], socket.socket(fileno=int(sys.argv[2])))


def serve(device: str, sock: socket.socket) -> int:
    from modelswap_client.mappers.cuda_vmm import CudaVmmMapper

    mapper = CudaVmmMapper(device=device, chunk_bytes=64 << 20)
    reservation = None
    handles: list[tuple[int, int, Any]] = []

    def send(body: dict[str, Any], fds: list[int] | None = None) -> None:
        socket.send_fds(sock, [json.dumps(body).encode()], fds or [])

    while True:
        data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 256)
        if not data:
            break
        msg = json.loads(data)
        if msg["op"] == "reserve":
            reservation = mapper.reserve(int(msg["bytes"]))
            send({"address": reservation.address})
        elif msg["op"] == "map":
            assert reservation is not None
            chunk_fds, host_fd = fds[:-1], fds[-1]
            for spec, fd in zip(msg["chunks"], chunk_fds, strict=True):
                h = mapper.import_fd(fd, int(spec["bytes"]))
                address = reservation.address + int(spec["offset"])
                mapper.map(address, int(spec["bytes"]), h)
                handles.append((address, int(spec["bytes"]), h))
            size = int(msg["host_bytes"])
            mapper.set_access(reservation.address, size)
            host = mapper.map_host(host_fd, size)
            events = [
                mapper.copy_to_device(reservation.address + off, host.address + off, n, i % 2)
                for i, (off, n) in enumerate(_pieces(size, 64 << 20))
            ]
            for event in events:
                event.wait()
            mapper.synchronize()
            mapper.unmap_host(host)
            os.close(host_fd)
            staging = os.memfd_create("readback")
            os.ftruncate(staging, size)
            out = mapper.map_host(staging, size, writable=True)
            mapper.copy_to_host(out.address, reservation.address, size).wait()
            mapper.unmap_host(out)
            digest = hashlib.sha256()
            offset = 0
            while offset < size:
                block = os.pread(staging, min(64 << 20, size - offset), offset)
                digest.update(block)
                offset += len(block)
            os.close(staging)
            send({"sha256": digest.hexdigest(), "address": reservation.address})
        elif msg["op"] == "export":
            assert reservation is not None
            exported: list[int] = []
            try:
                for address, _, _ in handles:
                    exported.append(mapper.export_mapped_fd(address))
            except Exception as e:  # answered, so the caller can still swap out and close
                send({"error": f"{type(e).__name__}: {e}"})
            else:
                specs = [{"offset": a - reservation.address, "bytes": n} for a, n, _ in handles]
                send({"exported": specs}, exported)
            for fd in exported:
                os.close(fd)  # sent: the receiver holds its own copies
        elif msg["op"] == "unmap":
            mapper.synchronize()
            for address, size, h in handles:
                mapper.unmap(address, size)
                mapper.release(h)
            handles.clear()
            send({"ok": True})
        elif msg["op"] == "exit":
            break
    if reservation is not None and not handles:
        mapper.free_reservation(reservation)
    mapper.close()
    sock.close()
    return 0


def _pieces(size: int, step: int) -> list[tuple[int, int]]:
    return [(off, min(step, size - off)) for off in range(0, size, step)]


if __name__ == "__main__":
    sys.exit(main())
