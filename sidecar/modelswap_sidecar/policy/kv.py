"""KV-cache settings handed to a model's tiered pool, and the host bytes a model needs.

KV blocks of sequences longer than `offloadAfterTokens` live in the host tier, up to
`kvCache.hostBytes` (DESIGN.md §5). The client's pool applies this per block; the agent
sends it these settings when the client registers and whenever the policy changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelswap_api.policy import EffectivePolicy


@dataclass(frozen=True, kw_only=True)
class KvPoolSettings:
    device_bytes: int  # spec.model.kvCacheBytes: the HBM tier
    offload_after_tokens: int
    host_bytes: int  # cap of the host tier
    preserve_on_swap_out: bool  # `kv: preserve`: saved to the host store, else discarded

    def to_dict(self) -> dict[str, int | bool]:
        return {
            "device_bytes": self.device_bytes,
            "offload_after_tokens": self.offload_after_tokens,
            "host_bytes": self.host_bytes,
            "preserve_on_swap_out": self.preserve_on_swap_out,
        }


def kv_pool_settings(policy: EffectivePolicy, kv_cache_bytes: int) -> KvPoolSettings:
    return KvPoolSettings(
        device_bytes=kv_cache_bytes,
        offload_after_tokens=policy.offload_after_tokens,
        host_bytes=policy.kv_host_bytes,
        preserve_on_swap_out=policy.kv == "preserve",
    )


def host_bytes_needed(policy: EffectivePolicy, weights_bytes: int, kv_cache_bytes: int) -> int:
    """Host-store bytes of a model: its weight copy (kept only with `onSwapOut: host`), its
    KV cache when preserved across swaps, and the host KV tier (none without a KV cache)."""
    weights = weights_bytes if policy.on_swap_out == "host" else 0
    preserved = kv_cache_bytes if policy.kv == "preserve" else 0
    return weights + preserved + (policy.kv_host_bytes if kv_cache_bytes else 0)
