"""The KV cache refuses a transformers older than 5.24 by name, when a cache is made.

5.17 refuses `generate(cache=...)` and 4.x ignores it silently: without the check either
fails far from its cause. The version is read from the package metadata, monkeypatched here.
"""

from __future__ import annotations

from importlib import metadata

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from modelswap_client import kv_cache  # noqa: E402
from modelswap_client.errors import ClientError  # noqa: E402
from modelswap_client.kv_cache import KvShape, PoolTensors  # noqa: E402
from modelswap_client.kvpool import TieredKvPool  # noqa: E402

TOKENS_PER_BLOCK = 4


@pytest.fixture
def tensors() -> PoolTensors:
    shape = KvShape(layers=1, kv_heads=1, head_dim=4, tokens_per_block=TOKENS_PER_BLOCK)
    hbm = torch.zeros(4 * shape.block_bytes, dtype=torch.uint8)
    pool = TieredKvPool(
        hbm.data_ptr(),
        hbm.numel(),
        block_bytes=shape.block_bytes,
        tokens_per_block=TOKENS_PER_BLOCK,
        offload_after_tokens=64,
        host_bytes=0,
    )
    return PoolTensors(pool, shape, hbm)


def installed(monkeypatch: pytest.MonkeyPatch, version: str | None) -> None:
    real = metadata.version

    def fake(name: str) -> str:
        if name != "transformers":
            return real(name)
        if version is None:
            raise metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(kv_cache.metadata, "version", fake)


@pytest.mark.parametrize("version", ["5.17.0", "4.46.3", "5.23.9", "5.2.0"])
def test_an_older_transformers_is_refused_naming_both_versions(
    monkeypatch: pytest.MonkeyPatch, tensors: PoolTensors, version: str
) -> None:
    tensors.pool.append_tokens("kept", 3)
    installed(monkeypatch, version)
    with pytest.raises(ClientError) as raised:
        tensors.cache("kept")
    assert f"found {version}" in str(raised.value)
    assert "5.24 or later" in str(raised.value)
    # refused before the pool was touched: the sequence's blocks are still there
    assert tensors.pool.tokens("kept") == 3


def test_a_missing_transformers_is_named(
    monkeypatch: pytest.MonkeyPatch, tensors: PoolTensors
) -> None:
    installed(monkeypatch, None)
    with pytest.raises(ClientError, match=r"transformers 5\.24 or later; it is not installed"):
        tensors.cache("s")


def test_an_unreadable_version_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, tensors: PoolTensors
) -> None:
    installed(monkeypatch, "unknown")
    with pytest.raises(ClientError, match="found unknown"):
        tensors.cache("s")


@pytest.mark.parametrize("version", ["5.24.0", "5.24.0.dev0", "5.30.1", "6.0.0"])
def test_5_24_and_later_make_a_cache(
    monkeypatch: pytest.MonkeyPatch, tensors: PoolTensors, version: str
) -> None:
    installed(monkeypatch, version)
    cache = tensors.cache("s")
    assert cache.get_seq_length() == 0
