"""The bearer token for the agents' control API, from a Secret the operator creates if it
is missing (the agents mount the same Secret, optional, and re-read it on change).

The token is re-read every `refresh_seconds`, so rotating it (editing the Secret) reaches
the operator without a restart; the agents accept the new one once their mount updates.
"""

from __future__ import annotations

import base64
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from modelswap_api import kube
from modelswap_operator.kubeio import KubeIO
from modelswap_operator.settings import TOKEN_KEY

log = logging.getLogger(__name__)
TOKEN_BYTES = 32


class TokenSource:
    def __init__(
        self,
        io: KubeIO,
        namespace: str,
        name: str,
        *,
        refresh_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.io = io
        self.namespace = namespace
        self.name = name
        self.refresh_seconds = refresh_seconds
        self.clock = clock
        self._token: str | None = None
        self._read_at = float("-inf")

    def __call__(self) -> str:
        """The token as last read (`ensure` must have run)."""
        if self._token is None:
            raise RuntimeError("the control token was never read")
        return self._token

    async def ensure(self) -> str:
        """Read the Secret (at most every refresh_seconds), creating it when missing."""
        if self._token is not None and self.clock() - self._read_at < self.refresh_seconds:
            return self._token
        secret = await self.io.call(kube.read_secret, self.namespace, self.name)
        if secret is None:
            secret = await self._create()
        encoded = (secret.get("data") or {}).get(TOKEN_KEY)
        if not encoded:
            raise kube.KubeError(f"Secret {self.namespace}/{self.name} has no {TOKEN_KEY!r} key")
        token = base64.b64decode(encoded).decode("utf-8").strip()
        if self._token is not None and token != self._token:
            log.info("control token changed in Secret %s/%s", self.namespace, self.name)
        self._token, self._read_at = token, self.clock()
        return token

    async def _create(self) -> dict[str, Any]:
        token = secrets.token_urlsafe(TOKEN_BYTES)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "type": "Opaque",
            "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
        }
        try:
            created = await self.io.call(kube.create_secret, self.namespace, body)
        except kube.Conflict:  # another replica made it first
            found = await self.io.call(kube.read_secret, self.namespace, self.name)
            if found is None:
                raise
            return found
        log.info("created the control token Secret %s/%s", self.namespace, self.name)
        return created
