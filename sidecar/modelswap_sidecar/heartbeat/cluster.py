"""The calls the heartbeat makes to the API server, as an async interface.

`KubeNodeCluster` runs the blocking `modelswap_api.kube` helpers in a thread
(`asyncio.to_thread`), so the agent's event loop never waits on the network. Tests can
pass any object with these methods (e.g. one that counts writes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from modelswap_api import kube


class NodeCluster(Protocol):
    async def read_node(self, name: str) -> dict[str, Any]: ...

    async def read_swapnode(self, name: str) -> dict[str, Any] | None: ...

    async def create_swapnode(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def patch_swapnode(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...

    async def replace_swapnode_status(
        self, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]: ...

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def replace_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


class KubeNodeCluster:
    """`NodeCluster` over one `kube.api_client(...)`; errors are `kube.KubeError`s."""

    def __init__(self, api: Any, *, timeout_seconds: float = kube.DEFAULT_TIMEOUT_SECONDS) -> None:
        self._api = api
        self._timeout = timeout_seconds

    async def read_node(self, name: str) -> dict[str, Any]:
        return await asyncio.to_thread(
            kube.read_node, self._api, name, timeout_seconds=self._timeout
        )

    async def read_swapnode(self, name: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(
            kube.read_swapnode, self._api, name, timeout_seconds=self._timeout
        )

    async def create_swapnode(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(
            kube.create_swapnode, self._api, body, timeout_seconds=self._timeout
        )

    async def patch_swapnode(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(
            kube.patch_swapnode, self._api, name, patch, timeout_seconds=self._timeout
        )

    async def replace_swapnode_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(
            kube.replace_swapnode_status, self._api, name, status, timeout_seconds=self._timeout
        )

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(
            kube.read_lease, self._api, namespace, name, timeout_seconds=self._timeout
        )

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(
            kube.create_lease, self._api, namespace, body, timeout_seconds=self._timeout
        )

    async def replace_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(
            kube.replace_lease, self._api, namespace, body, timeout_seconds=self._timeout
        )
