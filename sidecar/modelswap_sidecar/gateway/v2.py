"""KServe v2 REST in front of Triton, under the names users call.

    GET  /v2/health/live                         the gateway answers
    GET  /v2/health/ready                        the desired models known, Triton ready
    GET  /v2                                     Triton's server metadata, listing only
                                                 the extensions the gateway serves
    GET  [/ns/{ns}]/v2/models/stats                                every model's statistics
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
(load/unload) is not exposed, and `/v2` does not list it (`extensions`). `/v2/models/stats`
lists every model of the request's namespace (every model in local mode) that Triton holds,
each named `namespace/name`, as gRPC's `ModelStatistics` without a name does; like Triton,
it is never the metadata of a model named `stats` (`/v2/models/stats/stats` is its
statistics).

Bodies are checked before anything is forwarded or swapped in (400, naming what is
wrong): an inference request's inputs against the bytes the body carries for them
(`tensors.parse_infer`: Triton sizes its buffers from `shape` before reading the data, and
one request's shape took it down), and a generate request is a JSON object whose
`text_input` and `max_tokens` keep the model's bounds (`generation`; a generate_stream
without `max_tokens` ends after `maxTokens` responses); the session it names
(`X-Modelswap-Session`, else `parameters.session_id`) is sent scoped to the model's
namespace and name (`generation.scope_generate_body`). Then, once
the model's configuration is known (`config_reads.model_config`: read while Triton holds the
model, else after its swap-in), the inputs against its `dims` and `max_batch_size`
(`tensors.check_config`). When Triton's connection breaks while it holds a request, the
request is logged by model and counted (`modelswap_gateway_upstream_lost_total`): if Triton
crashed, the log names the request that may have caused it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiohttp import web

from modelswap_api.json_input import nesting_exceeds
from modelswap_sidecar.gateway import extensions, generation, sse, tensors
from modelswap_sidecar.gateway.bodies import MAX_JSON_DEPTH, read_body
from modelswap_sidecar.gateway.config_reads import model_config
from modelswap_sidecar.gateway.context import Call, Gateway, Handler
from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.errors import (
    BadRequestError,
    GatewayError,
    ModelNotKnownYetError,
    ModelSwappedOutError,
    TritonNotReadyError,
    TritonRefusedError,
    UpstreamError,
)
from modelswap_sidecar.gateway.exchange import STATE_HEADER, Exchange, route_for, wants_progress
from modelswap_sidecar.gateway.paths import Endpoint, PathTable
from modelswap_sidecar.gateway.rewrite import (
    rename_infer_response,
    rename_json,
    rename_stats,
    triton_message,
)
from modelswap_sidecar.gateway.routing import scope_of, statistics_names
from modelswap_sidecar.gateway.upstream import forwarded_headers, model_path
from modelswap_sidecar.triton.config import PARAMETER_PREFIX

logger = logging.getLogger(__name__)

INFER_HEADER_LENGTH = "Inference-Header-Content-Length"


def _get(handler: Handler) -> Endpoint[Handler]:
    return Endpoint("GET", handler, "v2")


def _post(handler: Handler) -> Endpoint[Handler]:
    return Endpoint("POST", handler, "v2")


def add_routes(paths: PathTable[Handler]) -> None:
    for tail, endpoint in (
        ("/infer", _post(_infer)),
        ("/generate", _post(_generate)),
        ("/generate_stream", _post(_generate_stream)),
        ("", _get(_metadata)),
        ("/ready", _get(_model_ready)),
        ("/stats", _get(_stats)),
    ):
        paths.v2_model(tail, endpoint)
    paths.v2_model("/config", _get(_config), versioned=False)  # Triton has none per version
    paths.fixed("/v2/health/live", _get(_live))
    paths.fixed("/v2/health/ready", _get(_server_ready))
    paths.fixed("/v2", _get(_server_metadata_of(paths)))
    # before `/v2/models/{m}` (a scoped path matches first), as Triton's own route is
    paths.scoped("/v2/models/stats", _get(_every_statistics))


async def _live(call: Call) -> web.Response:
    del call
    return web.json_response({"live": True})


async def _server_ready(call: Call) -> web.Response:
    gw = call.gw
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


def _server_metadata_of(paths: PathTable[Handler]) -> Handler:
    """`GET /v2`: Triton's server metadata, its `extensions` cut to those the gateway routes
    (`extensions.served`, read from `paths` when asked: every route is added by then)."""

    async def server_metadata(call: Call) -> web.Response:
        gw = call.gw
        async with await gw.upstream.open("GET", "/v2") as response:
            body = await gw.upstream.read(response)
        if response.status == 200:
            try:
                metadata = json.loads(body)
            except ValueError:
                metadata = None
            if isinstance(metadata, dict) and isinstance(metadata.get("extensions"), list):
                metadata["extensions"] = extensions.served(metadata["extensions"], paths)
                body = json.dumps(metadata, separators=(",", ":")).encode()
        return web.Response(status=response.status, body=body, content_type="application/json")

    return server_metadata


async def _every_statistics(call: Call) -> web.Response:
    """`GET [/ns/{ns}]/v2/models/stats`: Triton's statistics of every model it holds, kept
    to the request's namespace (from the path prefix or the Host, as for one model's; local
    mode without one: every model) and named `namespace/name`. Wakes no model."""
    gw = call.gw
    scope = scope_of(
        call.namespace, call.request.headers.get("Host"), local_mode=gw.settings.local_mode
    )
    names = statistics_names(gw.directory.routes(scope.namespace))
    async with await gw.upstream.open("GET", "/v2/models/stats") as answer:
        body = await gw.upstream.read(answer)
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if answer.status != 200 or not isinstance(parsed, dict):
        status = answer.status if answer.status >= 400 else 502
        raise TritonRefusedError(triton_message(body), status)
    kept = []
    for stats in parsed.get("model_stats") or ():
        triton_name = stats.get("name") if isinstance(stats, dict) else None
        name = names.get(triton_name) if isinstance(triton_name, str) else None
        if name is not None:
            kept.append({**stats, "name": name})
    return web.Response(
        body=json.dumps({"model_stats": kept}, separators=(",", ":")).encode(),
        content_type="application/json",
    )


async def _metadata(call: Call) -> web.Response:
    return await _model_document(call, "", "metadata")


async def _config(call: Call) -> web.Response:
    return await _model_document(call, "/config", "configuration")


async def _stats(call: Call) -> web.Response:
    return await _model_document(call, "/stats", "statistics")


async def _model_document(call: Call, tail: str, what: str) -> web.Response:
    """A GET about one model, from Triton, under the user's name; none of these wakes it."""
    gw = call.gw
    route = route_for(call)
    path = model_path(route.triton_name, call.version, tail)
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


async def _model_ready(call: Call) -> web.Response:
    gw = call.gw
    route = route_for(call)
    state = gw.directory.swap_state(route.uid)
    if not gw.directory.is_resident(route.uid):
        return web.Response(status=200, headers={STATE_HEADER: state})
    path = model_path(route.triton_name, call.version, "/ready")
    async with await gw.upstream.open("GET", path) as answer:
        body = rename_json(await gw.upstream.read(answer), route.triton_name, route.name)
        headers = {STATE_HEADER: state}
        return web.Response(status=answer.status, body=body or None, headers=headers)


async def _read_body(gw: Gateway, request: web.BaseRequest) -> bytes:
    """The body, read within its limits, its JSON part nested at most `MAX_JSON_DEPTH`
    deep: it goes to Triton unparsed, and Triton's parser overflows its stack on a body
    nested 200,000 deep (400 KB of brackets took the node's Triton down, every model
    with it). The JSON part is the whole body, or its first `Inference-Header-Content-
    Length` bytes when binary tensor data follows."""
    settings = gw.settings
    body = await read_body(
        request,
        max_bytes=settings.max_body_bytes,
        timeout_seconds=settings.body_timeout_seconds,
    )
    declared = tensors.header_length(request.headers.get(INFER_HEADER_LENGTH), len(body))
    json_part = body if declared is None else body[:declared]
    if nesting_exceeds(json_part, MAX_JSON_DEPTH):
        raise BadRequestError(f"the request's JSON is nested deeper than {MAX_JSON_DEPTH} levels")
    return body


def _refuse_decoupled(route: ModelRoute, what: str) -> None:
    if route.decoupled:
        raise BadRequestError(
            f"{route.name} is a decoupled model: Triton serves it through generate_stream "
            f"only, not {what}; use /v2/models/{route.name}/generate_stream or "
            "/v1/completions"
        )


async def _infer(call: Call) -> web.StreamResponse:
    route = route_for(call)
    _refuse_decoupled(route, "infer")
    body = await _read_body(call.gw, call.request)
    inputs = tensors.parse_infer(body, call.request.headers.get(INFER_HEADER_LENGTH))
    return await _whole(
        call, route, "/infer", body, lambda shape: tensors.check_config(inputs, shape, route.name)
    )


async def _generate(call: Call) -> web.StreamResponse:
    route = route_for(call)
    _refuse_decoupled(route, "generate")
    body = await _read_body(call.gw, call.request)
    fields = tensors.json_object(body, "the request's JSON")
    generation.check_generate_body(fields, route)
    body = _scoped(call, fields, route, body)
    return await _whole(
        call, route, "/generate", body,
        lambda shape: tensors.check_generate_config(fields, shape, route.name),
    )  # fmt: skip


def _scoped(call: Call, fields: Mapping[str, Any], route: ModelRoute, body: bytes) -> bytes:
    """The generate body with the session it names (`X-Modelswap-Session`, else
    `parameters.session_id`) scoped to the model's namespace and name
    (`generation.scope_generate_body`); as it came when it names none."""
    header = call.request.headers.get(generation.SESSION_HEADER)
    scoped = generation.scope_generate_body(fields, header, route)
    return body if scoped is None else json.dumps(scoped).encode()


async def _check_inputs(exchange: Exchange, check: Callable[[tensors.ModelShape], None]) -> None:
    """The inputs against the model's configuration (`check`, BadRequestError): before any
    swap-in when the configuration is known, else after it. Only the body's bounds hold
    when Triton gives no configuration the gateway can read."""
    gw, route = exchange.gw, exchange.route
    if gw.model_configs.get(route.triton_name) is None and not gw.directory.is_resident(route.uid):
        # the request is forwarded unless its configuration refuses it: swapped in (and its
        # wait counted) as any other, before its configuration is read
        await exchange.admit()
    try:
        config = await model_config(exchange)
    except TritonRefusedError as e:
        logger.info("no configuration of %s/%s to check against: %s", route.namespace,
                    route.name, e.message)  # fmt: skip
        return
    shape = tensors.model_shape(config)
    if shape is not None:
        check(shape)


def _lost(exchange: Exchange, tail: str, error: UpstreamError) -> None:
    """Triton's connection broke while it held this request: said by model, and counted,
    since a request's inputs can crash Triton and each crash counts towards the node's
    crash-loop give-up."""
    if exchange.call.ended is not None or isinstance(error.__cause__, ConnectionRefusedError):
        return  # Triton was not there to take it: nothing it held
    route = exchange.route
    exchange.gw.metrics.upstream_lost(route)
    logger.warning(
        "Triton's connection broke while it held a request (%s) for %s/%s (%s); if Triton "
        "crashed, this request may be why",
        tail.lstrip("/"),
        route.namespace,
        route.name,
        error.message,
    )


def _answer_length(text: str | None) -> int | None:
    return int(text) if text and text.isascii() and text.isdigit() else None


async def _whole(
    call: Call,
    route: ModelRoute,
    tail: str,
    body: bytes,
    check: Callable[[tensors.ModelShape], None],
) -> web.StreamResponse:
    """A request with one answer: its inputs checked against the model's configuration,
    forwarded as is, its answer renamed."""
    gw, request = call.gw, call.request
    exchange = Exchange(call, route, progress=wants_progress(request, streaming=False))
    try:
        headers = forwarded_headers(request.headers)
        await _check_inputs(exchange, check)
        try:
            answer = await exchange.forward("POST", tail, body=body, headers=headers)
        except UpstreamError as e:
            _lost(exchange, tail, e)
            raise
        async with answer:
            try:
                raw = await gw.upstream.read(answer)
            except UpstreamError as e:
                _lost(exchange, tail, e)
                raise
            if answer.status >= 400:
                gw.model_configs.forget(route.triton_name)  # it may have changed
            length = _answer_length(answer.header(INFER_HEADER_LENGTH))
            renamed, new_length = rename_infer_response(raw, length, route.triton_name, route.name)
            out_headers = None if new_length is None else {INFER_HEADER_LENGTH: str(new_length)}
            content_type = answer.header("Content-Type") or "application/json"
            exchange.record()
            return await exchange.answer(
                answer.status, renamed, content_type.split(";")[0], out_headers
            )
    except GatewayError as e:
        return await exchange.fail(e)


async def _generate_stream(call: Call) -> web.StreamResponse:
    """Triton's event stream passed through event by event, renamed."""
    gw, request = call.gw, call.request
    route = route_for(call)
    body = await _read_body(gw, request)
    fields = tensors.json_object(body, "the request's JSON")
    generation.check_generate_body(fields, route)
    scoped = _scoped(call, fields, route, body)
    cap = generation.ResponseCap(route)
    exchange = Exchange(call, route, progress=wants_progress(request, streaming=True))
    if scoped is body:  # no session: batched at the model, so shaped (`shaping`)
        exchange.shape_prompt_bytes = generation.prompt_bytes(fields)
    body = scoped
    try:
        headers = forwarded_headers(request.headers)
        await _check_inputs(
            exchange, lambda shape: tensors.check_generate_config(fields, shape, route.name)
        )
        async with await exchange.forward(
            "POST", "/generate_stream", body=body, headers=headers
        ) as answer:
            if answer.status != 200:
                raw = rename_json(await gw.upstream.read(answer), route.triton_name, route.name)
                return await exchange.answer(answer.status, raw, "application/json")
            parser = sse.EventParser()
            async for chunk in gw.upstream.chunks(answer):
                if not await _pass_all(exchange, parser.feed(chunk), route, cap):
                    break  # past the bound: leaving closes Triton's connection (cancelled)
            else:
                await _pass_all(exchange, parser.close(), route, cap)
            stream = await exchange.stream()
            await stream.write_eof()
            return stream
    except GatewayError as e:
        return await exchange.fail(e)
    finally:
        exchange.record()


async def _pass_all(
    exchange: Exchange, events: Iterable[sse.Event], route: ModelRoute, cap: generation.ResponseCap
) -> bool:
    """Pass `events` on; False once one arrives past the model's `max_tokens` (not passed:
    the stream ends there)."""
    for event in events:
        if not cap.take():
            logger.info("%s/%s: a generation reached %d responses (spec.gateway.maxTokens) "
                        "and was ended", route.namespace, route.name, cap.bound)  # fmt: skip
            return False
        await _pass_event(exchange, event, route.triton_name, route.name)
    return True


async def _pass_event(exchange: Exchange, event: sse.Event, triton_name: str, name: str) -> None:
    data = rename_json(event.data.encode(), triton_name, name).decode()
    await exchange.write(sse.data_event(data, None if event.event == "message" else event.event))
