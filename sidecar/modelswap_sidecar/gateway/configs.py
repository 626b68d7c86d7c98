"""Models' Triton configurations as the gateway reads them (`GET /v2/models/<m>/config`),
for the checks made before a request is forwarded: the `/v1/embeddings` contract and the
bounds of a v2 inference request's inputs (`tensors.check_config`).

A configuration is read before any swap-in while Triton still holds the model
(`onSwapOut: host`); a model Triton does not hold (dropped) is swapped in first, since
only Triton has its configuration. It is kept by Triton name for `MAX_AGE_SECONDS` (a
model reloaded with another configuration is read again soon; a request Triton refuses
forgets it at once), at most `limit` names, the oldest forgotten first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: How long a configuration read is trusted.
MAX_AGE_SECONDS = 30.0


class ModelConfigs:
    """Configurations by Triton name, each trusted for `max_age_seconds`; bounded."""

    def __init__(
        self,
        limit: int = 4096,
        max_age_seconds: float = MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = limit
        self._max_age_seconds = max_age_seconds
        self._clock = clock
        self._configs: dict[str, tuple[float, Any]] = {}

    def get(self, triton_name: str) -> Any:
        """The configuration read for `triton_name`, or None when none is trusted now."""
        found = self._configs.get(triton_name)
        if found is None:
            return None
        read_at, config = found
        if self._clock() - read_at > self._max_age_seconds:
            del self._configs[triton_name]
            return None
        return config

    def put(self, triton_name: str, config: Any) -> None:
        self._configs.pop(triton_name, None)
        self._configs[triton_name] = (self._clock(), config)
        while len(self._configs) > self._limit:
            del self._configs[next(iter(self._configs))]

    def forget(self, triton_name: str) -> None:
        self._configs.pop(triton_name, None)
