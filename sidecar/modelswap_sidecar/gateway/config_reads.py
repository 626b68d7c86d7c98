"""A request's model configuration: the cached one (`configs.ModelConfigs`), else read
from Triton, admitting the request (a swap-in) when Triton does not hold the model."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from modelswap_sidecar.gateway.context import Gateway
from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.errors import TritonRefusedError
from modelswap_sidecar.gateway.exchange import Exchange
from modelswap_sidecar.gateway.rewrite import rename_json, triton_message
from modelswap_sidecar.gateway.upstream import model_path

#: Reads of the configuration at most per request: before any swap-in, after it, and once
#: more when the model went away again in between.
_CONFIG_READS = 3


async def model_config(exchange: Exchange) -> Any:
    """The model's configuration (parsed JSON; None when Triton's answer is not JSON):
    remembered, else read from Triton, admitting the request (a swap-in) when Triton does
    not hold the model. TritonRefusedError when Triton will not give it."""
    return await read_model_config(exchange.gw, exchange.route, exchange.admit)


async def read_model_config(
    gw: Gateway, route: ModelRoute, admit: Callable[[], Awaitable[None]]
) -> Any:
    """`model_config` for any front: `admit` swaps the request's model in (the gRPC front
    reads the configuration through Triton's HTTP port too, so both fronts share one
    cached form of it)."""
    configs = gw.model_configs
    known = configs.get(route.triton_name)
    if known is not None:
        return known
    path = model_path(route.triton_name, None, "/config")
    for attempt in range(1, _CONFIG_READS + 1):
        async with await gw.upstream.open("GET", path) as answer:
            raw = await gw.upstream.read(answer)
        if answer.status == 200:
            break
        held_anyway = attempt > 1 and gw.directory.is_resident(route.uid)
        if attempt == _CONFIG_READS or held_anyway:
            message = triton_message(rename_json(raw, route.triton_name, route.name))
            raise TritonRefusedError(message, answer.status)
        await admit()
    try:
        config = json.loads(raw)
    except ValueError:
        return None
    configs.put(route.triton_name, config)
    return config
