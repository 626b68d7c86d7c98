"""OpenAI-compatible routes over Triton's `generate_stream` (translation in `openai`).

    GET  [/ns/{ns}]/v1/models                    models in the namespace (all in local mode)
    GET  [/ns/{ns}]/v1/models/{model}            one of them
    POST [/ns/{ns}]/v1/completions               prompt -> text
    POST [/ns/{ns}]/v1/chat/completions          messages -> message

A streaming request gets each response of the model as one chunk as soon as Triton sends
it (less a tail that could start a stop sequence), then a chunk with the finish reason,
the `usage` chunk when asked, and `data: [DONE]`; a non-streaming one gets the responses'
text joined. The answer ends at a stop sequence, which closes Triton's connection (the
generation is cancelled). A request asking what only the model can do (sampling fields,
log-probabilities, streamed usage) is checked against its configuration first
(`openai.check_support`). The OpenAI `model` may be written `namespace/name`.

Sessions (`generation.session_of`): the `X-Modelswap-Session` header, else OpenAI's `user`,
names the conversation; the model gets it scoped, `namespace/name/id`, in the request
parameter `session_id` (a model that keeps KV per session, as tinyllama does, reuses the
conversation's prefix on the next turn).

Bounds (`generation`): `max_tokens` above the model's `spec.gateway.maxTokens` and a
prompt (chat: the rendered messages) longer than its `maxPromptBytes` are 400
`GenerationBound` before any swap-in; a request without `max_tokens` is ended with
finish reason `length` when a response past `maxTokens` arrives.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web

from modelswap_sidecar.gateway import generation, openai, sse
from modelswap_sidecar.gateway.bodies import decode_json, read_body
from modelswap_sidecar.gateway.config_reads import model_config
from modelswap_sidecar.gateway.context import Call, Handler
from modelswap_sidecar.gateway.errors import (
    GatewayError,
    ModelStreamError,
    TritonRefusedError,
    UnknownModelError,
)
from modelswap_sidecar.gateway.exchange import Exchange, route_for, wants_progress
from modelswap_sidecar.gateway.paths import Endpoint, PathTable
from modelswap_sidecar.gateway.rewrite import public_message, rename_json, triton_message
from modelswap_sidecar.gateway.routing import display_ids, scope_of

DONE = b"data: [DONE]\n\n"


def add_routes(paths: PathTable[Handler]) -> None:
    paths.scoped("/v1/models", Endpoint("GET", _list, "openai"))
    paths.openai_model(Endpoint("GET", _get, "openai"))
    paths.scoped("/v1/completions", Endpoint("POST", _completions, "openai"))
    paths.scoped("/v1/chat/completions", Endpoint("POST", _chat, "openai"))


def _listed(call: Call) -> list[tuple[str, str, int]]:
    gw = call.gw
    scope = scope_of(
        call.namespace,
        call.request.headers.get("Host"),
        local_mode=gw.settings.local_mode,
    )
    routes = gw.directory.routes(scope.namespace)
    if scope.namespace is None:
        return [(model_id, route.namespace, 0) for model_id, route in display_ids(routes)]
    return sorted((route.name, route.namespace, 0) for route in routes)


async def _list(call: Call) -> web.Response:
    return web.json_response(openai.model_list(_listed(call)))


async def _get(call: Call) -> web.Response:
    wanted = call.model
    assert wanted is not None  # the path names it
    route = route_for(call)
    for model_id, owner, created in _listed(call):
        if owner == route.namespace and model_id in (route.name, wanted):
            entry = {"id": model_id, "object": "model", "created": created, "owned_by": owner}
            return web.json_response(entry)
    raise UnknownModelError(f"model {wanted!r} not found")


async def _completions(call: Call) -> web.StreamResponse:
    return await _text(call, openai.parse_completion)


async def _chat(call: Call) -> web.StreamResponse:
    return await _text(call, openai.parse_chat)


async def _text(call: Call, parse: Callable[[Any], openai.TextRequest]) -> web.StreamResponse:
    gw, request = call.gw, call.request
    body = decode_json(
        await read_body(
            request,
            max_bytes=gw.settings.max_openai_body_bytes,
            timeout_seconds=gw.settings.body_timeout_seconds,
        )
    )
    text_request = parse(body)
    route = route_for(call, text_request.model)
    generation.check_max_tokens(text_request.max_tokens, route)
    prompt_field = "prompt" if text_request.kind == "completion" else "messages"
    generation.check_prompt(generation.utf8_bytes(text_request.prompt), route, prompt_field)
    session = generation.session_of(
        request.headers.get(generation.SESSION_HEADER), text_request.user, "user"
    )
    session_id = None if session is None else generation.scoped_session(route, session)
    cap = generation.ResponseCap(route)
    exchange = Exchange(
        call, route, progress=wants_progress(request, streaming=text_request.stream)
    )
    if session_id is None:  # conversations run one by one at the model: never batched
        exchange.shape_prompt_bytes = generation.utf8_bytes(text_request.prompt)
    completion = openai.Completion(text_request, created=int(gw.clock()))
    try:
        if text_request.requirements():
            # What only the model can do (sampling, log-probabilities, token counts) is
            # declared in its configuration: read before any swap-in while Triton holds it.
            config = await model_config(exchange)
            openai.check_support(text_request, config, route.name)
        async with await exchange.forward(
            "POST", "/generate_stream", json_body=text_request.generate_body(session_id)
        ) as answer:
            if answer.status != 200:
                raw = rename_json(await gw.upstream.read(answer), route.triton_name, route.name)
                raise TritonRefusedError(triton_message(raw), answer.status)
            opening = completion.opening()
            if opening is not None:
                await exchange.write(sse.data_event(json.dumps(opening)))
            parser = sse.EventParser()
            async for chunk in gw.upstream.chunks(answer):
                if not await _add_all(exchange, completion, parser.feed(chunk), cap):
                    # past the bound or at a stop sequence: leaving closes Triton's
                    # connection, and Triton cancels the request
                    break
            else:
                await _add_all(exchange, completion, parser.close(), cap)
        if text_request.stream:
            await exchange.write(sse.data_event(json.dumps(completion.last_chunk())))
            usage = completion.usage_chunk()
            if usage is not None:
                await exchange.write(sse.data_event(json.dumps(usage)))
            await exchange.write(DONE)
            stream = await exchange.stream()
            await stream.write_eof()
            return stream
        body_bytes = json.dumps(completion.response()).encode()
        return await exchange.answer(200, body_bytes, "application/json")
    except ModelStreamError as e:
        error = TritonRefusedError(f"the model failed: {public_message(str(e))}", 500)
        return await exchange.fail(error)
    except GatewayError as e:
        return await exchange.fail(e)
    finally:
        exchange.record()


async def _add_all(
    exchange: Exchange,
    completion: openai.Completion,
    events: Iterable[sse.Event],
    cap: generation.ResponseCap,
) -> bool:
    """Add `events`; False once the answer ends: at a stop sequence (finish reason
    `stop`), or when one arrives past the model's `max_tokens` (not added: finish reason
    `length`)."""
    for event in events:
        if not cap.take():
            completion.finish_reason = "length"
            return False
        chunk = completion.add(openai.piece_of(event.data))
        if chunk is not None and completion.request.stream:
            await exchange.write(sse.data_event(json.dumps(chunk)))
        if completion.stopped:
            return False
    return True
