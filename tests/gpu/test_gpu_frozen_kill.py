"""A model process stopped with SIGSTOP while it maps HBM, then killed (what the agent does
to one that answers nothing: issue 26, item 6): once its socket reads end-of-file, the
chunks the agent releases are free on the GPU (NVML) and a new allocation of the same size
maps and round-trips byte-exact in a new process. The socket is what the engine waits for
before it releases a client's chunks (`ClientProtocol.client_gone`, `Swapper._drop_gone`).
The test process plays the agent, as in test_gpu_roundtrip.py.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.gpu.test_gpu_roundtrip import CHUNK_BYTES, MIB, Child, _model_file

MODEL_BYTES = 512 * MIB
#: how long NVML may take to show the dead process's memory free once its socket closed
FREED_WITHIN_SECONDS = 10.0


@pytest.mark.timeout(300)
def test_a_stopped_process_killed_frees_its_hbm_once_its_socket_closes(
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
    n_chunks = MODEL_BYTES // CHUNK_BYTES
    specs = [{"offset": i * CHUNK_BYTES, "bytes": CHUNK_BYTES} for i in range(n_chunks)]
    frozen = Child(uuid, gpu_env)
    fresh: Child | None = None
    try:
        frozen.ask({"op": "reserve", "bytes": MODEL_BYTES})
        free_at_start = nvml.memory(uuid).free_bytes
        chunks = [allocator.create(loc, CHUNK_BYTES) for _ in range(n_chunks)]
        fds = [allocator.export_fd(c) for c in chunks]
        reply = frozen.ask(
            {"op": "map", "chunks": specs, "host_bytes": MODEL_BYTES}, [*fds, weights]
        )
        for fd in fds:
            os.close(fd)
        assert reply["sha256"] == expected
        free_resident = nvml.memory(uuid).free_bytes
        assert free_at_start - free_resident >= MODEL_BYTES * 0.95

        os.kill(frozen.proc.pid, signal.SIGSTOP)  # it maps the chunks and answers nothing
        os.kill(frozen.proc.pid, signal.SIGKILL)  # the agent's kill
        frozen.sock.settimeout(30)
        assert frozen.sock.recv(1 << 16) == b"", "the socket must read end-of-file"
        for chunk in chunks:  # what the engine does then
            allocator.release(chunk)
        deadline = time.monotonic() + FREED_WITHIN_SECONDS
        while nvml.memory(uuid).free_bytes - free_resident < MODEL_BYTES * 0.95:
            assert time.monotonic() < deadline, (
                f"NVML: {(nvml.memory(uuid).free_bytes - free_resident) / MIB:.0f} MiB freed "
                f"{FREED_WITHIN_SECONDS:g} s after the killed process's socket closed"
            )
            time.sleep(0.05)
        frozen.proc.wait(30)
        assert frozen.proc.returncode == -signal.SIGKILL

        # The room is whole again: the same size, in a new process, byte-exact.
        fresh = Child(uuid, gpu_env)
        fresh.ask({"op": "reserve", "bytes": MODEL_BYTES})
        chunks = [allocator.create(loc, CHUNK_BYTES) for _ in range(n_chunks)]
        fds = [allocator.export_fd(c) for c in chunks]
        reply = fresh.ask(
            {"op": "map", "chunks": specs, "host_bytes": MODEL_BYTES}, [*fds, weights]
        )
        for fd in fds:
            os.close(fd)
        assert reply["sha256"] == expected, "bytes differ in the new process"
        assert fresh.ask({"op": "unmap"}) == {"ok": True}
        for chunk in chunks:
            allocator.release(chunk)
    finally:
        if frozen.proc.poll() is None:
            os.killpg(frozen.proc.pid, signal.SIGKILL)
            frozen.proc.wait()
        frozen.sock.close()
        if fresh is not None:
            fresh.stop()
        os.close(weights)
        allocator.close()
