"""What every gateway handler works with: the gateway, built once by `app.make_app`, and
one `Call` per request; `AtTriton`, the calls each model has at Triton now."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from modelswap_sidecar.gateway.configs import ModelConfigs
from modelswap_sidecar.gateway.directory import ModelDirectory, ModelRoute
from modelswap_sidecar.gateway.embeddings import CheckedModels
from modelswap_sidecar.gateway.errors import GatewayError
from modelswap_sidecar.gateway.metrics import GatewayMetrics
from modelswap_sidecar.gateway.queueing import SwapInQueues
from modelswap_sidecar.gateway.settings import GatewaySettings
from modelswap_sidecar.gateway.shaping import BatchShaper
from modelswap_sidecar.gateway.upstream import Upstream

#: Which API a route belongs to: how its errors are written.
Flavour = Literal["v2", "openai"]


class AtTriton:
    """The calls forwarded to Triton and not yet answered, by the model's Triton name, and
    the task serving each: `end` cancels them all (their connections to Triton close, so
    Triton cancels the requests) and has them answered with an error instead."""

    def __init__(self) -> None:
        self._calls: dict[str, dict[Call, asyncio.Task[Any]]] = {}

    def add(self, triton_name: str, call: Call) -> None:
        """`call`, served by the running task, is at Triton for the model `triton_name`."""
        task = asyncio.current_task()
        if task is not None and call.at_triton is None:
            call.at_triton = triton_name
            self._calls.setdefault(triton_name, {})[call] = task

    def discard(self, call: Call) -> None:
        name = call.at_triton
        if name is None:
            return
        call.at_triton = None
        calls = self._calls.get(name)
        if calls is not None:
            calls.pop(call, None)
            if not calls:
                del self._calls[name]

    def count(self, triton_name: str) -> int:
        return len(self._calls.get(triton_name, ()))

    def end(self, triton_name: str, error: GatewayError) -> int:
        """End every call at Triton for `triton_name`: each is answered `error` (in its
        stream when one is open). The number ended."""
        calls = self._calls.pop(triton_name, {})
        for call, task in calls.items():
            call.at_triton = None
            call.ended = error
            task.cancel(error.message)
        return len(calls)


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
    #: The calls at Triton now, by model, for `GatewayApp.end_requests`.
    at_triton: AtTriton = field(default_factory=AtTriton)
    #: Prompt-length buckets of the models with `spec.gateway.batchShaping` on.
    shaper: BatchShaper = field(default_factory=BatchShaper)


class Call:
    """One request: aiohttp's request, the parameters its path named, and what the handlers
    found out about it (read when it is counted and when its errors are written). A plain
    object with slots: the server makes one per request."""

    __slots__ = ("admitted", "at_triton", "code", "ended", "exchange", "flavour", "gw", "model",
                 "namespace", "request", "route", "version")  # fmt: skip

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
        #: the Triton name of the model it is at Triton for (`AtTriton`), while it is
        self.at_triton: str | None = None
        #: why the gateway ended it (`AtTriton.end`): what it is answered instead
        self.ended: GatewayError | None = None
        #: its `exchange.Exchange`, once it has one (an ended call's open stream)
        self.exchange: object = None


#: An endpoint's handler.
Handler = Callable[[Call], Awaitable[web.StreamResponse]]
