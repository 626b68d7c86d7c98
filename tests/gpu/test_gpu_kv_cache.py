"""`modelswap_client.kv_cache` on real HBM (cuda-vmm): a Llama's K/V in the pool's blocks,
the HBM tier a CUDA view of the KV region, the host tier (the agent's host-store file)
staged to the GPU for attention. Greedy tokens equal plain transformers on the same GPU
for prompts shorter and longer than offloadAfterTokens, across a `preserve` swap with no
prefix token computed again, and across a `discard` swap recomputed from the token ids
(a cache written before raises instead of reading the fresh region).

The engine (cuda-vmm allocator) and its protocol server run in this process, the client
in the same process (vouched for by pid), as test_gpu_torch.py does. Needs torch with
CUDA and transformers (5.x, with the `cache` argument); skips without them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

MIB = 1 << 20
MODEL = "m"
OFFLOAD_AFTER_TOKENS = 32
NEW = 8
VOCAB = 256


def _torch() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    pytest.importorskip("transformers")
    return torch


@dataclass
class Node:
    engine: Any
    socket_path: str
    mode: str


@pytest.fixture(params=["preserve", "discard"])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Node]:
    _torch()
    from modelswap_api.wire import KvMode
    from modelswap_sidecar.allocators.cuda_vmm import CudaVmmAllocator
    from modelswap_sidecar.engine.core import Engine, EngineSettings
    from modelswap_sidecar.engine.hoststore import HostStore
    from modelswap_sidecar.engine.records import ModelConfig
    from modelswap_sidecar.engine.server import EngineServer
    from modelswap_sidecar.engine.vouching import RegisteredVoucher
    from modelswap_sidecar.gpu.nvml import NvmlMemory

    # the host store must be memory (tmpfs), as in the chart (cuMemHostRegister)
    store_dir = Path(tempfile.mkdtemp(prefix="modelswap-gpu-kv-", dir="/dev/shm"))
    allocator = CudaVmmAllocator(gpus=[0], nvml=NvmlMemory.open(), chunk_bytes=2 * MIB)
    store = HostStore(store_dir / "store", {0: 1024 * MIB})
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
    mode = KvMode(request.param)
    engine.add_model(
        ModelConfig(
            MODEL, 0, mode, kv_offload_after_tokens=OFFLOAD_AFTER_TOKENS, kv_host_bytes=4 * MIB
        )
    )
    sock = tmp_path / "agent.sock"
    server = EngineServer(engine, sock)
    server.start()
    try:
        yield Node(engine, str(sock), request.param)
    finally:
        server.close()
        engine.close()
        allocator.close()
        shutil.rmtree(store_dir, ignore_errors=True)


def _build(torch: Any) -> Any:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval().cuda()


@pytest.mark.timeout(300)
def test_a_conversation_continues_across_a_swap_with_plain_transformers_tokens(
    node: Node,
) -> None:
    torch = _torch()
    from modelswap_client import kv_cache
    from modelswap_client import torch as mstorch
    from modelswap_client.client import RegionSpec, attach
    from modelswap_client.kv_sessions import KvSessionStore
    from modelswap_client.kvpool import Tier

    path, mode = node.socket_path, node.mode
    reference = _build(torch)
    att = attach(
        MODEL,
        [RegionSpec("weights", 4 * MIB), RegionSpec("kv", 2 * MIB, "kv")],
        socket_path=path,
        mapper="cuda-vmm",
        timeout_seconds=60,
    )
    try:
        model = _build(torch)
        mstorch.adopt(att, model)
        kv = kv_cache.for_attachment(att, model.config)
        assert kv.device.type == "cuda"
        store = KvSessionStore(kv, namespace="ns", model=MODEL, max_sessions=4, hold=att.in_use)

        def plain(ids: Any) -> Any:
            with torch.no_grad():
                return reference.generate(
                    ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False
                )

        def chat(sid: str, ids: Any) -> tuple[Any, Any]:
            with store.turn(sid, ids, model) as turn, torch.no_grad():
                out = model.generate(
                    ids, cache=turn.cache, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False
                )
                turn.keep(out)
            return out, turn

        g = torch.Generator().manual_seed(1)
        for sid, length in (("short", 12), ("long", 60)):
            ids = torch.randint(1, VOCAB, (1, length), generator=g).cuda()
            first, _ = chat(sid, ids)
            assert torch.equal(first, plain(ids))
            tiers = [b.tier for b in kv.pool.blocks(sid)]
            assert (Tier.HOST in tiers) == (length + NEW > OFFLOAD_AFTER_TOKENS)
            direct = kv.cache(f"direct-{sid}")
            with att.in_use(), torch.no_grad():
                model(input_ids=first, cache=direct, use_cache=True)
            generation = att.kv_generation
            node.engine.swap_out(MODEL)
            follow = torch.cat([first, torch.randint(1, VOCAB, (1, 5), generator=g).cuda()], 1)
            if mode == "discard":
                with att.in_use():
                    assert att.kv_generation > generation
                    with pytest.raises(kv_cache.KvCacheLost):
                        direct.get_seq_length()
            out, turn = chat(sid, follow)
            assert torch.equal(out, plain(follow))
            if mode == "preserve":
                assert turn.reused_tokens == first.shape[1] - 1 and turn.recomputed_tokens == 0
            else:
                assert turn.reused_tokens == 0 and turn.recomputed_tokens == first.shape[1] - 1
            with att.in_use():
                direct.free()
    finally:
        att.close()
