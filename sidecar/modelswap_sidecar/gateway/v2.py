"""KServe v2 REST in front of Triton, under the names users call.

    GET  /v2/health/live                         the gateway answers
    GET  /v2/health/ready                        the desired models known, Triton ready
    GET  /v2                                     Triton's server metadata
    GET  [/ns/{ns}]/v2/models/{m}[/versions/{v}]                  model metadata
    GET  [/ns/{ns}]/v2/models/{m}[/versions/{v}]/ready            model readiness
    GET  [/ns/{ns}]/v2/models/{m}/config                          model configuration
    GET  [/ns/{ns}]/v2/models/{m}[/versions/{v}]/stats            inference statistics
    POST [/ns/{ns}]/v2/models/{m}[/versions/{v}]/infer            inference
    POST [/ns/{ns}]/v2/models/{m}[/versions/{v}]/generate         generate extension
    POST [/ns/{ns}]/v2/models/{m}[/versions/{v}]/generate_stream  generate extension (SSE)

Inference and generate requests swap a swapped-out model in (see `queueing`); metadata
and readiness do not, and do not count as use: a probe must not keep a model resident. A
swapped-out model is ready (it serves on request) and says where it is in
`X-Modelswap-State`; its metadata, configuration and statistics come from Triton when
Triton still holds it (`onSwapOut: host`) and are otherwise a 503 until the next inference.
The configuration is shown without the `modelswap.` parameters the agent adds (how a model
reaches the agent is none of a caller's business, DESIGN.md §1). Triton's repository API
(load/unload) is not exposed.
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

from modelswap_sidecar.gateway import sse
from modelswap_sidecar.gateway.bodies import read_body
from modelswap_sidecar.gateway.context import GATEWAY, Gateway
from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.errors import (
    BadRequestError,
    GatewayError,
    ModelNotKnownYetError,
    ModelSwappedOutError,
    TritonNotReadyError,
)
from modelswap_sidecar.gateway.exchange import (
    FLAVOUR,
    STATE_HEADER,
    Exchange,
    route_for,
    wants_progress,
)
from modelswap_sidecar.gateway.rewrite import rename_infer_response, rename_json, rename_stats
from modelswap_sidecar.gateway.upstream import forwarded_headers, model_path
from modelswap_sidecar.triton.config import PARAMETER_PREFIX

logger = logging.getLogger(__name__)

INFER_HEADER_LENGTH = "Inference-Header-Content-Length"
_MODEL_PREFIXES = ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")


def add_routes(app: web.Application) -> None:
    router = app.router
    # The router tries the routes under one path prefix in the order they were added:
    # inference first, as it is most of the traffic.
    for ns in ("", "/ns/{ns}"):
        for model in _MODEL_PREFIXES:
            base = ns + model
            router.add_post(base + "/infer", _infer)
            router.add_post(base + "/generate", _generate)
            router.add_post(base + "/generate_stream", _generate_stream)
            router.add_get(base, _metadata, allow_head=False)
            router.add_get(base + "/ready", _model_ready, allow_head=False)
            router.add_get(base + "/stats", _stats, allow_head=False)
            if model == _MODEL_PREFIXES[0]:  # Triton has no per-version config route
                router.add_get(base + "/config", _config, allow_head=False)
    router.add_get("/v2/health/live", _live, allow_head=False)
    router.add_get("/v2/health/ready", _server_ready, allow_head=False)
    router.add_get("/v2", _server_metadata, allow_head=False)


def _gateway(request: web.Request) -> Gateway:
    request[FLAVOUR] = "v2"
    return request.app[GATEWAY]


async def _live(request: web.Request) -> web.Response:
    del request
    return web.json_response({"live": True})


async def _server_ready(request: web.Request) -> web.Response:
    gw = _gateway(request)
    if not gw.directory.knows_desired():
        raise ModelNotKnownYetError(
            "the node does not know its desired models yet", retry_after_seconds=1
        )
    async with await gw.upstream.open("GET", "/v2/health/ready") as response:
        if response.status == 200:
            return web.Response(status=200)
    raise TritonNotReadyError(
        f"Triton is not ready (it answered {response.status})", retry_after_seconds=1
    )


async def _server_metadata(request: web.Request) -> web.Response:
    gw = _gateway(request)
    async with await gw.upstream.open("GET", "/v2") as response:
        body = await gw.upstream.read(response)
        return web.Response(status=response.status, body=body, content_type="application/json")


def _triton_path(request: web.Request, triton_name: str, tail: str = "") -> str:
    return model_path(triton_name, request.match_info.get("version"), tail)


async def _metadata(request: web.Request) -> web.Response:
    return await _model_document(request, "", "metadata")


async def _config(request: web.Request) -> web.Response:
    return await _model_document(request, "/config", "configuration")


async def _stats(request: web.Request) -> web.Response:
    return await _model_document(request, "/stats", "statistics")


async def _model_document(request: web.Request, tail: str, what: str) -> web.Response:
    """A GET about one model, from Triton, under the user's name; none of these wakes it."""
    gw = _gateway(request)
    route = route_for(gw, request, request.match_info["model"])
    path = _triton_path(request, route.triton_name, tail)
    async with await gw.upstream.open("GET", path) as answer:
        body = await gw.upstream.read(answer)
        if answer.status >= 400 and not gw.directory.is_resident(route.uid):
            raise ModelSwappedOutError(
                f"{route.namespace}/{route.name} is swapped out; its {what} is served "
                "again after its next inference",
                retry_after_seconds=gw.settings.retry_after_seconds,
            )
        if tail == "/config" and answer.status == 200:
            body = _without_agent_parameters(body)
        rename = rename_stats if tail == "/stats" else rename_json
        return web.Response(
            status=answer.status,
            body=rename(body, route.triton_name, route.name),
            content_type="application/json",
        )


def _without_agent_parameters(body: bytes) -> bytes:
    try:
        config = json.loads(body)
    except ValueError:
        return body
    parameters = config.get("parameters") if isinstance(config, dict) else None
    if isinstance(parameters, dict):
        config["parameters"] = {
            k: v for k, v in parameters.items() if not k.startswith(PARAMETER_PREFIX)
        }
    return json.dumps(config, separators=(",", ":")).encode()


async def _model_ready(request: web.Request) -> web.Response:
    gw = _gateway(request)
    route = route_for(gw, request, request.match_info["model"])
    state = gw.directory.swap_state(route.uid)
    if not gw.directory.is_resident(route.uid):
        return web.Response(status=200, headers={STATE_HEADER: state})
    path = _triton_path(request, route.triton_name, "/ready")
    async with await gw.upstream.open("GET", path) as answer:
        body = rename_json(await gw.upstream.read(answer), route.triton_name, route.name)
        headers = {STATE_HEADER: state}
        return web.Response(status=answer.status, body=body or None, headers=headers)


async def _read_body(gw: Gateway, request: web.Request) -> bytes:
    settings = gw.settings
    return await read_body(
        request,
        max_bytes=settings.max_body_bytes,
        timeout_seconds=settings.body_timeout_seconds,
    )


def _refuse_decoupled(route: ModelRoute, what: str) -> None:
    if route.decoupled:
        raise BadRequestError(
            f"{route.name} is a decoupled model: Triton serves it through generate_stream "
            f"only, not {what}; use /v2/models/{route.name}/generate_stream or "
            "/v1/completions"
        )


async def _infer(request: web.Request) -> web.StreamResponse:
    gw = _gateway(request)
    route = route_for(gw, request, request.match_info["model"])
    _refuse_decoupled(route, "infer")
    return await _whole(gw, request, route, "/infer")


async def _generate(request: web.Request) -> web.StreamResponse:
    gw = _gateway(request)
    route = route_for(gw, request, request.match_info["model"])
    _refuse_decoupled(route, "generate")
    return await _whole(gw, request, route, "/generate")


async def _whole(
    gw: Gateway, request: web.Request, route: ModelRoute, tail: str
) -> web.StreamResponse:
    """A request with one answer: forwarded as is, its answer renamed."""
    body = await _read_body(gw, request)
    exchange = Exchange(gw, request, route, progress=wants_progress(request, streaming=False))
    try:
        headers = forwarded_headers(request.headers)
        async with await exchange.forward("POST", tail, body=body, headers=headers) as answer:
            raw = await gw.upstream.read(answer)
            length_text = answer.header(INFER_HEADER_LENGTH)
            length = int(length_text) if length_text and length_text.isdigit() else None
            renamed, new_length = rename_infer_response(raw, length, route.triton_name, route.name)
            out_headers = {} if new_length is None else {INFER_HEADER_LENGTH: str(new_length)}
            content_type = answer.header("Content-Type") or "application/json"
            exchange.record()
            return await exchange.answer(
                answer.status, renamed, content_type.split(";")[0], out_headers
            )
    except GatewayError as e:
        return await exchange.fail(e)


async def _generate_stream(request: web.Request) -> web.StreamResponse:
    """Triton's event stream passed through event by event, renamed."""
    gw = _gateway(request)
    route = route_for(gw, request, request.match_info["model"])
    body = await _read_body(gw, request)
    exchange = Exchange(gw, request, route, progress=wants_progress(request, streaming=True))
    try:
        headers = forwarded_headers(request.headers)
        async with await exchange.forward(
            "POST", "/generate_stream", body=body, headers=headers
        ) as answer:
            if answer.status != 200:
                raw = rename_json(await gw.upstream.read(answer), route.triton_name, route.name)
                return await exchange.answer(answer.status, raw, "application/json")
            parser = sse.EventParser()
            async for chunk in gw.upstream.chunks(answer):
                for event in parser.feed(chunk):
                    await _pass_event(exchange, event, route.triton_name, route.name)
            for event in parser.close():
                await _pass_event(exchange, event, route.triton_name, route.name)
            stream = await exchange.stream()
            await stream.write_eof()
            return stream
    except GatewayError as e:
        return await exchange.fail(e)
    finally:
        exchange.record()


async def _pass_event(exchange: Exchange, event: sse.Event, triton_name: str, name: str) -> None:
    data = rename_json(event.data.encode(), triton_name, name).decode()
    await exchange.write(sse.data_event(data, None if event.event == "message" else event.event))
