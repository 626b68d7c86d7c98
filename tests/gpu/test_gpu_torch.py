"""`modelswap_client.torch` on real HBM (cuda-vmm): a PyTorch module adopted into a region
answers the same after a swap cycle, a CUDA graph captured over it before a swap-out
replays correctly after the swap-in (the addresses did not move), and a new attachment
binds a module built on meta to the host copy without reading the weight files.

The engine (cuda-vmm allocator) and its protocol server run in this process, the client
library in the same process (vouched for by pid), as tests/integration/test_cuda_engine_fake.py
does on the fake. Needs torch with CUDA (the GPU machine's own) and transformers for the
Hugging Face case; each skips without them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

MIB = 1 << 20
MODEL = "m"


@dataclass
class Node:
    engine: Any
    socket_path: str

    def attach(self, weights_bytes: int) -> Any:
        """Attach as a (re)started model process would: the engine may still be seeing
        the last attachment's socket close."""
        from modelswap_client.client import ClientError, RegionSpec, attach

        deadline = time.monotonic() + 10
        while True:
            try:
                return attach(
                    MODEL,
                    [RegionSpec("weights", weights_bytes)],
                    socket_path=self.socket_path,
                    mapper="cuda-vmm",
                    timeout_seconds=60,
                )
            except ClientError as e:
                if (
                    not ("already connected" in str(e) or "already attached" in str(e))
                    or time.monotonic() > deadline
                ):
                    raise
                time.sleep(0.05)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    # the host store must be memory (tmpfs), as in the chart: cuMemHostRegister refuses
    # (CUDA_ERROR_INVALID_VALUE) a mapping of a disk-backed file
    store_dir = Path(tempfile.mkdtemp(prefix="modelswap-gpu-torch-", dir="/dev/shm"))
    try:
        yield from _node(tmp_path, store_dir)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)


def _node(tmp_path: Path, store_dir: Path) -> Iterator[Node]:
    from modelswap_api.wire import KvMode
    from modelswap_sidecar.allocators.cuda_vmm import CudaVmmAllocator
    from modelswap_sidecar.engine.core import Engine, EngineSettings
    from modelswap_sidecar.engine.hoststore import HostStore
    from modelswap_sidecar.engine.records import ModelConfig
    from modelswap_sidecar.engine.server import EngineServer
    from modelswap_sidecar.engine.vouching import RegisteredVoucher
    from modelswap_sidecar.gpu.nvml import NvmlMemory

    allocator = CudaVmmAllocator(gpus=[0], nvml=NvmlMemory.open(), chunk_bytes=64 * MIB)
    store = HostStore(store_dir / "store", {0: 4096 * MIB})
    voucher = RegisteredVoucher()
    voucher.register(os.getpid(), MODEL)
    engine = Engine(
        allocator,
        store,
        voucher,
        EngineSettings(readopt_grace_seconds=1.0),
        decider=lambda name: engine.swap_in(name),  # noqa: PLW0108 - built by this call
    )
    engine.recover()
    engine.add_model(ModelConfig(MODEL, 0, KvMode.DISCARD))
    sock = tmp_path / "agent.sock"
    server = EngineServer(engine, sock)
    server.start()
    try:
        yield Node(engine, str(sock))
    finally:
        server.close()
        engine.close()
        allocator.close()


def _torch() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


def _inside(att: Any, module: Any) -> bool:
    region = att.regions["weights"]
    return all(
        region.address <= t.data_ptr() < region.address + region.size_bytes
        for t in [*module.parameters(), *module.buffers()]
    )


def _mlp(torch: Any) -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()


@pytest.mark.timeout(300)
def test_adopted_module_answers_the_same_and_a_cuda_graph_replays_after_a_swap(
    node: Node,
) -> None:
    torch = _torch()
    from modelswap_client import torch as mstorch

    model = _mlp(torch)
    x = torch.randn(8, 1024, device="cuda")
    with torch.no_grad():
        before = model(x).clone()
    att = node.attach(mstorch.required_bytes(model))
    try:
        mstorch.adopt(att, model)
        assert _inside(att, model)
        with att.in_use(), torch.no_grad():
            want = model(x).clone()  # kernels may pick other algorithms at new addresses
        assert torch.allclose(want, before, atol=1e-5)
        # a graph captured over the region's addresses, before any swap
        static_x = x.clone()
        graph = torch.cuda.CUDAGraph()
        with att.in_use(), torch.no_grad():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                model(static_x)  # warm-up on a side stream, as capture requires
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):
                static_y = model(static_x)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static_y, want)
        for _ in range(3):
            node.engine.swap_out(MODEL)
            with att.in_use(), torch.no_grad():  # swaps in first: same addresses
                assert torch.equal(model(x), want)
                static_y.zero_()
                graph.replay()
                torch.cuda.synchronize()
                assert torch.equal(static_y, want), "the graph read other bytes after swap-in"
    finally:
        att.close()


@pytest.mark.timeout(300)
def test_a_new_attachment_binds_a_hugging_face_model_without_its_weight_files(
    node: Node, tmp_path: Path
) -> None:
    torch = _torch()
    transformers = pytest.importorskip("transformers")
    from modelswap_client import torch as mstorch

    folder = tmp_path / "bert"
    config = transformers.BertConfig(
        vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=1024, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(3)
    transformers.BertModel(config).save_pretrained(folder)
    ids = torch.tensor([[1, 5, 9, 100, 2]], device="cuda")
    reference = transformers.BertModel.from_pretrained(folder).cuda().eval()
    with torch.no_grad():
        want = reference(input_ids=ids).last_hidden_state
    del reference
    need = mstorch.required_bytes(mstorch.build_pretrained(transformers.AutoModel, folder))

    att = node.attach(need)
    model = mstorch.from_pretrained(att, transformers.AutoModel, folder)
    assert _inside(att, model) and next(model.parameters()).is_cuda
    with att.in_use(), torch.no_grad():
        assert torch.allclose(model(input_ids=ids).last_hidden_state, want, atol=1e-5)
    att.close()

    shutil.move(folder / "model.safetensors", tmp_path / "moved.safetensors")
    att = node.attach(need)  # a restarted model process: only the host copy can answer
    try:
        assert att.restored
        model = mstorch.from_pretrained(att, transformers.AutoModel, folder)
        node.engine.swap_out(MODEL)
        with att.in_use(), torch.no_grad():
            assert torch.allclose(model(input_ids=ids).last_hidden_state, want, atol=1e-5)
    finally:
        att.close()
