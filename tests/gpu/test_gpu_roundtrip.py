"""Two processes round-trip a model through real HBM, byte-exact, and NVML sees it freed.

The test process plays the agent (cuda-vmm allocator: cuMemCreate + export, no context);
a child plays the model process (cuda-vmm mapper). Unverified until run on a GPU machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

MIB = 1 << 20
MODEL_BYTES = 512 * MIB
CHUNK_BYTES = 128 * MIB
HERE = Path(__file__).resolve().parent


def _model_file(size: int) -> tuple[int, str]:
    """A memfd holding reproducible pseudo-random bytes (read-only fd) and their sha256."""
    block = hashlib.shake_256(b"modelswap-gpu-test").digest(4 * MIB)
    fd = os.memfd_create("weights")
    digest = hashlib.sha256()
    for offset in range(0, size, len(block)):
        piece = block[: min(len(block), size - offset)]
        os.write(fd, piece)
        digest.update(piece)
    ro = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    os.close(fd)
    return ro, digest.hexdigest()


class Child:
    def __init__(self, uuid: str, env: dict[str, str]) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "_client_child.py"), uuid, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), env=env, start_new_session=True,
        )  # fmt: skip
        theirs.close()
        self.sock.settimeout(60)

    def ask(self, body: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        socket.send_fds(self.sock, [json.dumps(body).encode()], fds or [])
        reply = self.sock.recv(1 << 16)
        assert reply, f"the model process died (exit {self.proc.poll()})"
        result: dict[str, Any] = json.loads(reply)
        return result

    def stop(self) -> None:
        try:
            socket.send_fds(self.sock, [json.dumps({"op": "exit"}).encode()], [])
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        finally:
            self.sock.close()


@pytest.mark.timeout(300)
def test_two_processes_round_trip_byte_exact_and_nvml_sees_hbm_freed(
    gpu_env: dict[str, str],
) -> None:
    from modelswap_sidecar.allocators.base import Location
    from modelswap_sidecar.allocators.cuda_vmm import CudaVmmAllocator
    from modelswap_sidecar.gpu.nvml import NvmlMemory

    nvml = NvmlMemory.open()
    assert nvml is not None, "nvidia-ml-py is required on GPU machines"
    allocator = CudaVmmAllocator(gpus=[0], nvml=nvml, chunk_bytes=CHUNK_BYTES)
    uuid = allocator.gpus[0].uuid
    loc = Location.device(0)
    weights, expected = _model_file(MODEL_BYTES)
    child = Child(uuid, gpu_env)
    try:
        address = child.ask({"op": "reserve", "bytes": MODEL_BYTES})["address"]
        free_at_start = nvml.memory(uuid).free_bytes
        for _cycle in range(2):
            chunks = [allocator.create(loc, CHUNK_BYTES) for _ in range(MODEL_BYTES // CHUNK_BYTES)]
            fds = [allocator.export_fd(c) for c in chunks]
            specs = [{"offset": i * CHUNK_BYTES, "bytes": CHUNK_BYTES} for i in range(len(chunks))]
            reply = child.ask(
                {"op": "map", "chunks": specs, "host_bytes": MODEL_BYTES}, [*fds, weights]
            )
            for fd in fds:
                os.close(fd)  # sent: the agent's copies of the fds go too
            assert reply["sha256"] == expected, "bytes differ after the round trip"
            assert reply["address"] == address, "the model moved"
            free_resident = nvml.memory(uuid).free_bytes
            assert free_at_start - free_resident >= MODEL_BYTES * 0.95
            assert child.ask({"op": "unmap"}) == {"ok": True}
            for chunk in chunks:
                allocator.release(chunk)
            free_out = nvml.memory(uuid).free_bytes
            assert free_out - free_resident >= MODEL_BYTES * 0.95, (
                f"NVML: only {(free_out - free_resident) / MIB:.0f} MiB freed by swap-out"
            )
    finally:
        child.stop()
        os.close(weights)
        allocator.close()
    assert child.proc.returncode == 0
