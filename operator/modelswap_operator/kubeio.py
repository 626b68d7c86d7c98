"""Kubernetes calls off the event loop: `modelswap_api.kube`'s blocking helpers run in a
bounded thread pool, so a slow API server delays the calls in flight, never the loop (kopf's
watches and handlers share it). Each call is counted for /metrics by helper and outcome.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from modelswap_api import kube
from modelswap_operator.metrics import OperatorMetrics

T = TypeVar("T")


class KubeIO:
    def __init__(self, api: Any, *, threads: int, metrics: OperatorMetrics) -> None:
        self.api = api
        self.metrics = metrics
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="kube"
        )

    async def call(self, helper: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`helper(api, *args, **kwargs)` in the pool; KubeError as the helper raises it."""
        loop = asyncio.get_running_loop()
        name = getattr(helper, "__name__", "call")
        try:
            result = await loop.run_in_executor(
                self._pool, functools.partial(helper, self.api, *args, **kwargs)
            )
        except kube.KubeError as e:
            self.metrics.kube_calls.labels(name, str(e.status or "unreachable")).inc()
            raise
        self.metrics.kube_calls.labels(name, "ok").inc()
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
