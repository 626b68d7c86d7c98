"""The MemPool route on a real GPU: `with att.allocations("weights"):` around an unmodified
Hugging Face `from_pretrained(...).cuda()` puts every parameter and buffer in the region;
the model answers the same after swap-out/swap-in cycles (the region's bytes came back
from the host store at the same addresses); a full region makes torch raise its
out-of-memory error and leaves the model intact.

Agent and model process share this process: the real engine and protocol server on the
cuda-vmm allocator, the client library on the cuda-vmm mapper, torch on the same primary
context. Needs the GPU machine's own torch and transformers (skips without them); the
model is a tiny Llama randomly initialised from a fixed seed, nothing downloaded. The
allocation shim is built on first use (`native_build`; the machine's `cc`).
"""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

MIB = 1 << 20
REGION_BYTES = 64 * MIB
FILLER_BYTES = 12 * MIB  # over torch's 10 MiB line: its segment is the size itself
PROMPTS = [[1, 17, 42, 99, 3, 250, 7, 64], [5, 5, 5, 200, 201, 202, 0, 1]]


def _libraries() -> tuple[Any, Any]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch, transformers


def _save_tiny_llama(transformers: Any, torch: Any, folder: Path) -> None:
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(1234)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)


class Agent:
    """The real engine and server over the cuda-vmm allocator on GPU 0."""

    def __init__(self, workdir: Path) -> None:
        from modelswap_api.wire import KvMode
        from modelswap_sidecar.allocators.cuda_vmm import CudaVmmAllocator
        from modelswap_sidecar.engine.core import Engine, EngineSettings
        from modelswap_sidecar.engine.hoststore import HostStore
        from modelswap_sidecar.engine.records import ModelConfig
        from modelswap_sidecar.engine.server import EngineServer
        from modelswap_sidecar.engine.vouching import RegisteredVoucher

        self.allocator = CudaVmmAllocator(gpus=[0], nvml=None, chunk_bytes=32 * MIB)
        self.uuid = self.allocator.gpus[0].uuid
        voucher = RegisteredVoucher()
        voucher.register(os.getpid(), "m")
        store = HostStore(workdir / "store", {0: 512 * MIB})
        self.engine = Engine(
            self.allocator,
            store,
            voucher,
            EngineSettings(readopt_grace_seconds=1.0),
            decider=lambda name: self.engine.swap_in(name),  # noqa: PLW0108 - built by this call
        )
        self.engine.recover()
        self.engine.add_model(ModelConfig("m", 0, KvMode.DISCARD))
        self.socket = workdir / "agent.sock"
        self.server = EngineServer(self.engine, self.socket)
        self.server.start()

    def close(self) -> None:
        self.server.close()
        self.engine.close()
        self.allocator.close()


@pytest.fixture
def agent() -> Iterator[Agent]:
    # In memory, as the node's host store is (a memory-backed emptyDir): cuMemHostRegister
    # refused (CUDA_ERROR_INVALID_VALUE) a store file on the GPU machine's disk-backed /tmp.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="ms-gpu-", dir=shm) as workdir:  # short socket path
        a = Agent(Path(workdir))
        try:
            yield a
        finally:
            a.close()


def _logits(torch: Any, model: Any) -> Any:
    ids = torch.tensor(PROMPTS, device="cuda")
    with torch.no_grad():
        return model(input_ids=ids).logits.float().cpu()


@pytest.mark.timeout(300)
def test_from_pretrained_lands_in_the_region_and_answers_the_same_after_swaps(
    agent: Agent, tmp_path: Path
) -> None:
    torch, transformers = _libraries()
    from modelswap_client.allocation import RegionPool
    from modelswap_client.client import ClientState, RegionSpec, attach

    folder = tmp_path / "tiny-llama"
    _save_tiny_llama(transformers, torch, folder)
    plain = transformers.AutoModelForCausalLM.from_pretrained(folder).cuda().eval()
    expected = _logits(torch, plain)  # the same weights through torch's own allocator
    del plain

    att = attach("m", [RegionSpec("weights", REGION_BYTES)], socket_path=str(agent.socket),
                 mapper="cuda-vmm", device=agent.uuid, timeout_seconds=60)  # fmt: skip
    model: Any = None
    try:
        region = att.regions["weights"]
        low, high = region.address, region.address + region.size_bytes
        with att.allocations("weights") as pool:
            model = transformers.AutoModelForCausalLM.from_pretrained(folder).cuda().eval()
        assert isinstance(pool, RegionPool)
        named = [*model.named_parameters(), *model.named_buffers()]
        assert named, "the model has tensors"
        outside = [n for n, t in named if t.is_cuda and not low <= t.data_ptr() < high]
        assert outside == [], f"not in the region: {outside}"
        tensor_bytes = sum(t.numel() * t.element_size() for _, t in named)
        stats = pool.stats()
        assert stats.in_use_bytes >= tensor_bytes and stats.refused_frees == 0
        stray = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
        assert not low <= stray.data_ptr() < high, "outside the context: torch's own memory"

        att.commit()
        with att.in_use():
            before = _logits(torch, model)
        assert torch.equal(before, expected), "the region route loaded different weights"
        for _cycle in range(2):
            agent.engine.swap_out("m")
            assert att.state is ClientState.SWAPPED_OUT
            agent.engine.swap_in("m")
            with att.in_use():
                after = _logits(torch, model)
            assert torch.equal(after, before), "answers changed across a swap"
            assert att.regions["weights"].address == low, "the region stayed put"

        # a full region: torch's OutOfMemoryError, the model untouched
        fillers = []
        with att.allocations("weights") as again:
            assert again is pool, "one pool per region"
            with pytest.raises(torch.OutOfMemoryError):
                torch.empty(REGION_BYTES, dtype=torch.uint8, device="cuda")
            while True:
                try:
                    fillers.append(torch.empty(FILLER_BYTES, dtype=torch.uint8, device="cuda"))
                except torch.OutOfMemoryError:
                    break
            full = pool.stats()
        assert fillers, "the region had room for at least one filler"
        assert all(low <= f.data_ptr() < high for f in fillers)
        assert full.largest_free_bytes < FILLER_BYTES
        assert full.failed_allocations >= 2 and full.refused_frees == 0
        with att.in_use():
            assert torch.equal(_logits(torch, model), before), "OOM in the pool hurt the model"
        del fillers
    finally:
        torch.cuda.synchronize()
        del model
        gc.collect()
        att.close()
