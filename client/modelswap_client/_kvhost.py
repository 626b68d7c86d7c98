"""The KV pool's host tier: the writable mapping of the agent-owned host-store file the
attach reply carries, with the model's `kvCache` policy, and the pools built over it."""

from __future__ import annotations

import sys

from modelswap_api.wire import ErrorCode, Message, RegionKind
from modelswap_client.errors import ClientError
from modelswap_client.kvpool import TieredKvPool
from modelswap_client.mappers.base import HostBuffer, Mapper
from modelswap_client.regions import Region


class KvHostTier:
    """Empty until `take` maps a host tier; `drop` unmaps it (its file is deleted)."""

    def __init__(self, mapper: Mapper) -> None:
        self._mapper = mapper
        self._host: HostBuffer | None = None
        #: the policy's `offloadAfterTokens` (None: no host tier) and `hostBytes`
        self.offload_after_tokens: int | None = None
        self.host_bytes = 0

    def take(self, reply: Message) -> None:
        """Map the host-tier file an attach reply carries (writable: it is KV, never a
        weight copy), then close the reply's fds; a reply without one closes them only."""
        doc = reply.body.get("kv_pool")
        if not doc:
            reply.close_fds()
            return
        fd = reply.fds[int(doc["fd"])]
        try:
            size = int(doc["host_bytes"])
            self.drop()
            self._host = self._mapper.map_host(fd, size, writable=True)
            self.offload_after_tokens = int(doc["offload_after_tokens"])
            self.host_bytes = size
        finally:
            reply.close_fds()

    def drop(self) -> None:
        if self._host is not None:
            self._mapper.unmap_host(self._host)
            self._host = None

    def pool(self, region: Region, *, block_bytes: int, tokens_per_block: int) -> TieredKvPool:
        """A tiered pool whose HBM tier is KV `region` and whose host tier is the mapping
        (without one, every block comes from HBM)."""
        if region.kind is not RegionKind.KV:
            raise ClientError(
                f"region {region.tag} is {region.kind}, not kv", ErrorCode.BAD_REQUEST
            )
        host, offload = self._host, self.offload_after_tokens
        if host is None or offload is None:
            return TieredKvPool(
                region.address,
                region.size_bytes,
                block_bytes=block_bytes,
                tokens_per_block=tokens_per_block,
                offload_after_tokens=sys.maxsize,
                host_bytes=0,
            )
        return TieredKvPool(
            region.address,
            region.size_bytes,
            block_bytes=block_bytes,
            tokens_per_block=tokens_per_block,
            offload_after_tokens=offload,
            host_bytes=self.host_bytes,
            host_address=host.address,
        )
