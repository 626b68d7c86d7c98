"""The one module that talks to node agents: their control API (`/v1`, DESIGN.md §3).

The API server is the trust anchor: an agent publishes its serving certificate in its
SwapNode status (only that node's agent may write it), and the client for that node trusts
exactly that certificate (`modelswap_api.tls.pinned_context`). Plain HTTP is used only
when the endpoint says `http://` and the settings allow it (tests, local experiments).
Every call carries the bearer token. Errors come back as `AgentError`s, never as httpx's.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from modelswap_api.control import DesiredSet, DesiredSetResult, ErrorBody, NodeInfo
from modelswap_api.errors import ContractError
from modelswap_api.tls import pinned_context
from modelswap_operator.errors import AgentError, AgentRefused, AgentUnreachable, AgentUntrusted


@dataclass(frozen=True)
class AgentAddress:
    """How to reach one node's agent, as its SwapNode says."""

    node: str
    endpoint: str
    certificate: str | None

    @classmethod
    def of(cls, swapnode: Mapping[str, Any]) -> AgentAddress | None:
        status = swapnode.get("status") or {}
        endpoint = status.get("endpoint")
        if not endpoint:
            return None
        name = str((swapnode.get("metadata") or {}).get("name") or "")
        return cls(node=name, endpoint=str(endpoint), certificate=status.get("certificate"))


class AgentClient:
    """One node's control API."""

    def __init__(
        self, address: AgentAddress, token: str, *, timeout_seconds: float, allow_plain_http: bool
    ) -> None:
        self.address = address
        verify: ssl.SSLContext | bool = False
        if address.endpoint.startswith("https://"):
            if not address.certificate:
                raise AgentUntrusted(
                    f"node {address.node}: its SwapNode publishes no certificate for "
                    f"{address.endpoint}"
                )
            verify = pinned_context(address.certificate)
        elif not allow_plain_http:
            raise AgentUntrusted(
                f"node {address.node}: endpoint {address.endpoint} is not https "
                "(plain HTTP to agents is off)"
            )
        self._http = httpx.AsyncClient(
            base_url=address.endpoint,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_seconds,
            verify=verify,
            trust_env=False,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def put_desired(self, desired: DesiredSet) -> DesiredSetResult:
        body = await self._call("PUT", "/v1/desired", json=desired.to_dict())
        return DesiredSetResult.from_dict(body)

    async def node(self) -> NodeInfo:
        """`GET /v1/node`: among the rest, the highest revision the agent has seen."""
        body = await self._call("GET", "/v1/node")
        try:
            return NodeInfo.from_dict(body)
        except ContractError as e:
            raise AgentError(f"GET /v1/node on node {self.address.node}: {e}") from e

    async def delete_model(self, uid: str) -> str:
        """Forget `uid` and its host-store bytes; the agent's reason (`Forgotten`,
        `NotHeld`). AgentRefused `StillDesired` while the agent's set still holds it."""
        body = await self._call("DELETE", f"/v1/models/{uid}")
        return str(body.get("reason") or "")

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        what = f"{method} {path} on node {self.address.node}"
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.ConnectError as e:
            if isinstance(e.__cause__, ssl.SSLCertVerificationError) or "CERTIFICATE" in str(e):
                raise AgentUntrusted(
                    f"{what}: the agent's certificate does not match its SwapNode's: {e}"
                ) from e
            raise AgentUnreachable(f"{what}: {e}") from e
        except httpx.HTTPError as e:
            raise AgentUnreachable(f"{what}: {type(e).__name__}: {e}") from e
        try:
            body = response.json()
        except (ValueError, json.JSONDecodeError) as e:
            raise AgentError(f"{what}: {response.status_code}, not JSON") from e
        if response.status_code >= 400 or not isinstance(body, dict):
            error = (
                ErrorBody.from_dict(body) if isinstance(body, dict) and "reason" in body else None
            )
            raise AgentRefused(
                f"{what}: {response.status_code} "
                + (f"{error.reason}: {error.message}" if error else response.text[:200]),
                status=response.status_code,
                reason=error.reason if error else "",
                field=error.field if error else None,
            )
        return body


class AgentClients:
    """A client per node, rebuilt when the node's endpoint, certificate or the token changes."""

    def __init__(self, *, timeout_seconds: float, allow_plain_http: bool) -> None:
        self._timeout_seconds = timeout_seconds
        self._allow_plain_http = allow_plain_http
        self._clients: dict[str, tuple[AgentAddress, str, AgentClient]] = {}

    async def for_node(self, address: AgentAddress, token: str) -> AgentClient:
        held = self._clients.get(address.node)
        if held is not None and held[0] == address and held[1] == token:
            return held[2]
        if held is not None:
            await held[2].aclose()
            del self._clients[address.node]
        client = AgentClient(
            address,
            token,
            timeout_seconds=self._timeout_seconds,
            allow_plain_http=self._allow_plain_http,
        )
        self._clients[address.node] = (address, token, client)
        return client

    async def aclose(self) -> None:
        for _, _, client in self._clients.values():
            await client.aclose()
        self._clients.clear()
