"""OpenAI-compatible embeddings over Triton's `infer` (translation in `embeddings`).

    POST [/ns/{ns}]/v1/embeddings                text(s) -> one vector each

The model is named as on the other OpenAI routes (`model`, which may be written
`namespace/name`; the Service host; the `/ns/` prefix) and is swapped in, queued and
counted as they are (`exchange`). Before its first request the model's configuration is
read from Triton and checked against the contract (`embeddings.check_contract`); a model
that keeps it is remembered by its Triton name, and forgotten when Triton refuses an
inference for it, so a model reloaded with another configuration is checked again. The
configuration is read before any swap-in while Triton still holds the model
(`onSwapOut: host`), so a model that cannot embed is refused without being swapped in;
a dropped model is swapped in first. A decoupled model is refused before anything.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from modelswap_sidecar.gateway import embeddings
from modelswap_sidecar.gateway.bodies import decode_json, read_body
from modelswap_sidecar.gateway.config_reads import model_config
from modelswap_sidecar.gateway.context import Call, Handler
from modelswap_sidecar.gateway.errors import (
    GatewayError,
    NotAnEmbeddingModelError,
    TritonRefusedError,
)
from modelswap_sidecar.gateway.exchange import Exchange, route_for, wants_progress
from modelswap_sidecar.gateway.paths import Endpoint, PathTable
from modelswap_sidecar.gateway.rewrite import rename_json, triton_message
from modelswap_sidecar.gateway.v2 import INFER_HEADER_LENGTH


def add_routes(paths: PathTable[Handler]) -> None:
    paths.scoped("/v1/embeddings", Endpoint("POST", _embeddings, "openai"))


async def _embeddings(call: Call) -> web.StreamResponse:
    gw, request = call.gw, call.request
    body = decode_json(
        await read_body(
            request,
            max_bytes=gw.settings.max_openai_body_bytes,
            timeout_seconds=gw.settings.body_timeout_seconds,
        )
    )
    wanted = embeddings.parse_embeddings(body)
    route = route_for(call, wanted.model)
    if route.decoupled:
        raise NotAnEmbeddingModelError(
            f"{route.name} is a decoupled model: Triton serves it through generate_stream "
            "only, and embeddings need infer"
        )
    exchange = Exchange(call, route, progress=wants_progress(request, streaming=False))
    try:
        await _check_contract(exchange)
        payload, header_length = wanted.infer_request()
        headers = (
            f"Content-Type: application/octet-stream\r\n{INFER_HEADER_LENGTH}: {header_length}\r\n"
        )
        async with await exchange.forward(
            "POST", "/infer", body=payload, headers=headers
        ) as answer:
            raw = await gw.upstream.read(answer)
            length_text = answer.header(INFER_HEADER_LENGTH)
        if answer.status != 200:
            gw.embedding_models.forget(route.triton_name)
            gw.model_configs.forget(route.triton_name)
            message = triton_message(rename_json(raw, route.triton_name, route.name))
            raise TritonRefusedError(message, answer.status)
        length = (
            int(length_text)
            if length_text and length_text.isascii() and length_text.isdigit()
            else None
        )
        result = embeddings.embeddings_of(raw, length, len(wanted.texts))
        embeddings.check_dimensions(wanted, result.width)
        pieces = []
        for piece in embeddings.response_pieces(wanted, result):
            pieces.append(piece)
            await asyncio.sleep(0)  # a large answer formats in steps; others get turns
        return await exchange.answer(200, b"".join(pieces), "application/json")
    except GatewayError as e:
        return await exchange.fail(e)
    finally:
        exchange.record()


async def _check_contract(exchange: Exchange) -> None:
    """Return once the model's configuration is known to keep the contract (admitting the
    request when Triton does not hold the model); NotAnEmbeddingModelError when it does
    not. The configuration comes through `config_reads.model_config`, which the v2 inference
    bounds share."""
    gw, route = exchange.gw, exchange.route
    if route.triton_name in gw.embedding_models:
        return
    config = await model_config(exchange)
    try:
        embeddings.check_contract(config, route.name)
    except NotAnEmbeddingModelError:
        # read again next time: the model may be reloaded with the contract meanwhile
        gw.model_configs.forget(route.triton_name)
        raise
    gw.embedding_models.add(route.triton_name)
