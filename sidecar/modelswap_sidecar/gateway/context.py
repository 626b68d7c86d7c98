"""What every gateway handler works with: the gateway, built once by `app.make_app`, and
one `Call` per request."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from aiohttp import web

from modelswap_sidecar.gateway.configs import ModelConfigs
from modelswap_sidecar.gateway.directory import ModelDirectory, ModelRoute
from modelswap_sidecar.gateway.embeddings import CheckedModels
from modelswap_sidecar.gateway.metrics import GatewayMetrics
from modelswap_sidecar.gateway.queueing import SwapInQueues
from modelswap_sidecar.gateway.settings import GatewaySettings
from modelswap_sidecar.gateway.upstream import Upstream

#: Which API a route belongs to: how its errors are written.
Flavour = Literal["v2", "openai"]


@dataclass(frozen=True)
class Gateway:
    directory: ModelDirectory
    settings: GatewaySettings
    queues: SwapInQueues
    upstream: Upstream
    metrics: GatewayMetrics
    #: Wall-clock seconds (epoch), for last-request times and OpenAI `created`.
    clock: Callable[[], float]
    #: Models whose configuration was found to keep the `/v1/embeddings` contract.
    embedding_models: CheckedModels = field(default_factory=CheckedModels)
    #: Models' Triton configurations, read for the checks made before forwarding.
    model_configs: ModelConfigs = field(default_factory=ModelConfigs)


class Call:
    """One request: aiohttp's request, the parameters its path named, and what the handlers
    found out about it (read when it is counted and when its errors are written). A plain
    object with slots: the server makes one per request."""

    __slots__ = ("admitted", "code", "flavour", "gw", "model", "namespace", "request", "route",
                 "version")  # fmt: skip

    def __init__(self, gw: Gateway, request: web.BaseRequest) -> None:
        self.gw = gw
        self.request = request
        self.flavour: Flavour = "v2"
        #: the path's `/ns/{namespace}/` prefix, model and version, where it names them
        self.namespace: str | None = None
        self.model: str | None = None
        self.version: str | None = None
        #: the model the request is for, once known (its metrics labels)
        self.route: ModelRoute | None = None
        #: the status the answer stands for, when not the response's own (a progress
        #: stream's error)
        self.code: int | None = None
        #: admitted to its model: counted in flight until answered
        self.admitted = False


#: An endpoint's handler.
Handler = Callable[[Call], Awaitable[web.StreamResponse]]
