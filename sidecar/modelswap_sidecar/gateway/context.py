"""What every gateway handler works with, built once by `app.make_app`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from modelswap_sidecar.gateway.directory import ModelDirectory
from modelswap_sidecar.gateway.metrics import GatewayMetrics
from modelswap_sidecar.gateway.queueing import SwapInQueues
from modelswap_sidecar.gateway.settings import GatewaySettings
from modelswap_sidecar.gateway.upstream import Upstream


@dataclass(frozen=True)
class Gateway:
    directory: ModelDirectory
    settings: GatewaySettings
    queues: SwapInQueues
    upstream: Upstream
    metrics: GatewayMetrics
    #: Wall-clock seconds (epoch), for last-request times and OpenAI `created`.
    clock: Callable[[], float]


GATEWAY = web.AppKey("gateway", Gateway)
