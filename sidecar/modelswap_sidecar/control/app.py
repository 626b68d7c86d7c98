"""The control API's aiohttp application and server (DESIGN.md §3; routes under `/v1`).

    PUT    /v1/desired                  the node's full desired set (409 for an older term)
    GET    /v1/node                     capacity, revision, fencing
    GET    /v1/models                   every model held
    GET    /v1/models/{uid}             one model
    DELETE /v1/models/{uid}             forget a model no longer desired (host bytes too)
    POST   /v1/models/{uid}/swap-in     manual swap-in
    POST   /v1/models/{uid}/swap-out    manual swap-out
    POST   /v1/models/{uid}/reload      load again from the source (?hostCopy=keep|drop)
    GET    /v1/openapi.yaml             the OpenAPI document (no token needed)

Every other answer needs `Authorization: Bearer <token>`: 401 without one, 403 with a
wrong one. Errors are JSON `ErrorBody`s; a malformed body is a 400 naming the field.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from modelswap_api.control import (
    ActionResult,
    Cause,
    DesiredSet,
    ErrorBody,
    ModelList,
    check_uid,
    parse_desired_set,
)
from modelswap_api.errors import ModelError, ResourceError
from modelswap_api.json_input import JsonInputError, loads_bounded
from modelswap_sidecar.control.auth import TokenFile, Verdict
from modelswap_sidecar.control.errors import (
    DesiredStoreError,
    RefusedError,
    RevisionStoreError,
    UnknownModelError,
)
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings

logger = logging.getLogger(__name__)

SERVICE = web.AppKey("control_service", ControlService)
TOKEN = web.AppKey("control_token", TokenFile)
OPENAPI_PATH = "/v1/openapi.yaml"
_PUBLIC = frozenset({OPENAPI_PATH})
#: Deepest nesting a desired set's JSON may have (a ModelDeployment spec is ~6 levels under
#: its entry); deeper bodies are refused before anything walks them.
MAX_BODY_DEPTH = 32

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(service: ControlService, token: TokenFile) -> web.Application:
    app = web.Application(
        middlewares=[_errors, _authenticate],
        client_max_size=service.settings.max_body_bytes,
    )
    app[SERVICE] = service
    app[TOKEN] = token
    app.router.add_put("/v1/desired", _put_desired)
    app.router.add_get("/v1/node", _get_node, allow_head=False)
    app.router.add_get("/v1/models", _list_models, allow_head=False)
    # Any segment is a uid to the router (aiohttp's default leaves out `{` and `}`), so a
    # malformed one reaches `_uid` and is refused 400 naming `uid`, never an unrouted 404.
    model = "/v1/models/{uid:[^/]+}"
    app.router.add_get(model, _get_model, allow_head=False)
    app.router.add_delete(model, _delete_model)
    app.router.add_post(model + "/swap-in", _swap_in)
    app.router.add_post(model + "/swap-out", _swap_out)
    app.router.add_post(model + "/reload", _reload)
    app.router.add_get(OPENAPI_PATH, _openapi, allow_head=False)
    app.cleanup_ctx.append(_unload_timer)
    return app


def ssl_context_of(settings: ControlSettings) -> ssl.SSLContext | None:
    """HTTPS with the agent's serving certificate when it has one (not in local mode)."""
    return settings.tls.server_context() if settings.tls is not None else None


async def start(
    app: web.Application, *, on_server: Callable[[web.Server], None] | None = None
) -> web.AppRunner:
    """Serve `app` on the settings' host and port; the caller cleans the runner up.
    `on_server` sees the server before it accepts a connection (the agent caps them)."""
    settings = app[SERVICE].settings
    ssl_context = ssl_context_of(settings)
    # No request body is decoded (aiohttp would inflate a gzip bomb inside the event loop,
    # before the token is checked): a Content-Encoding is a 415. The keep-alive timer also
    # bounds a connection that trickles its headers.
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        auto_decompress=False,
        keepalive_timeout=settings.idle_timeout_seconds,
    )
    await runner.setup()
    if on_server is not None:
        assert runner.server is not None
        on_server(runner.server)
    site = web.TCPSite(runner, settings.host, settings.port, ssl_context=ssl_context)
    await site.start()
    logger.info(
        "control API on %s:%d (%s)",
        settings.host,
        settings.port,
        "https" if ssl_context else "plain http",
    )
    return runner


def openapi_text() -> str:
    """The OpenAPI document (docs/control-api.openapi.yaml, shipped with the package)."""
    return (
        importlib.resources.files("modelswap_sidecar.control")
        .joinpath("openapi.yaml")
        .read_text(encoding="utf-8")
    )


# --- middlewares -----------------------------------------------------------------------------


def _error(
    status: int,
    reason: str,
    message: str,
    *,
    field: str | None = None,
    causes: tuple[Cause, ...] | None = None,
) -> web.Response:
    body = ErrorBody(reason=reason, message=message, field=field, causes=causes)
    return web.json_response(body.to_dict(), status=status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _error(e.status, e.reason.replace(" ", ""), e.text or e.reason)
    except ResourceError as e:
        causes = tuple(Cause(field=c.path, reason=c.reason, message=c.message) for c in e.errors)
        return _error(400, "Invalid", str(e), field=causes[0].field, causes=causes)
    except ModelError as e:
        return _error(400, "Invalid", str(e), field=e.path)
    except RefusedError as e:
        return _error(409, e.reason, e.message)
    except UnknownModelError as e:
        return _error(404, "NotFound", str(e))
    except RevisionStoreError as e:
        logger.error("revision state: %s", e)
        return _error(503, "RevisionStoreUnavailable", str(e))
    except DesiredStoreError as e:  # logged by the writer
        return _error(503, "DesiredStoreUnavailable", str(e))
    except Exception:
        logger.exception("%s %s failed", request.method, request.path)
        return _error(500, "InternalError", "the agent failed to handle the request")


@web.middleware
async def _authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in _PUBLIC:
        return await handler(request)
    verdict = request.app[TOKEN].check(request.headers.get("Authorization"))
    if verdict is Verdict.OK:
        return await handler(request)
    if verdict is Verdict.MISSING:
        response = _error(401, "Unauthorized", "a bearer token is required")
        response.headers["WWW-Authenticate"] = 'Bearer realm="modelswap-agent"'
        return response
    if verdict is Verdict.WRONG:
        logger.warning("control API: wrong token from %s", request.remote)
        return _error(403, "Forbidden", "the bearer token is not valid")
    return _error(503, "TokenUnavailable", "this agent has no control token to check against")


# --- handlers --------------------------------------------------------------------------------


def decode_body(raw: bytes) -> object:
    """The body's JSON; ModelError (a 400) when it is not UTF-8, not JSON, nested deeper
    than `MAX_BODY_DEPTH` or holds a non-finite number. The body's size is bounded before
    (`client_max_size`, 413)."""
    try:
        return loads_bounded(raw, MAX_BODY_DEPTH)
    except JsonInputError as e:
        raise ModelError(e.path, str(e)) from e


async def _read_body(request: web.Request) -> bytes:
    """The body as sent: no Content-Encoding (415), within `body_timeout_seconds` (408);
    its size bounded by `max_body_bytes`, declared or sent (413)."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise web.HTTPUnsupportedMediaType(
            text=f"Content-Encoding {encoding[:40]!r} is not accepted: send the body as is"
        )
    settings = request.app[SERVICE].settings
    declared = request.content_length
    if declared is not None and declared > settings.max_body_bytes:
        raise web.HTTPRequestEntityTooLarge(
            max_size=settings.max_body_bytes, actual_size=declared
        )  # at once, not after reading the first max_body_bytes
    timeout_seconds = settings.body_timeout_seconds
    try:
        async with asyncio.timeout(timeout_seconds):
            return await request.read()
    except TimeoutError as e:
        raise web.HTTPRequestTimeout(
            text=f"the request body did not arrive within {timeout_seconds:g} s"
        ) from e


def _desired_set_of(raw: bytes) -> DesiredSet:
    return parse_desired_set(decode_body(raw))


async def _put_desired(request: web.Request) -> web.Response:
    raw = await _read_body(request)
    # Checking a large set (schema and CEL per entry) takes CPU time: in a thread, so the
    # event loop goes on serving the gateway and the other routes meanwhile.
    desired = await asyncio.to_thread(_desired_set_of, raw)
    result = await request.app[SERVICE].put_desired(desired)
    return web.json_response(result.to_dict())


async def _get_node(request: web.Request) -> web.Response:
    info = await request.app[SERVICE].node_info()
    return web.json_response(info.to_dict())


async def _list_models(request: web.Request) -> web.Response:
    models = await request.app[SERVICE].models()
    return web.json_response(ModelList(models=models).to_dict())


async def _get_model(request: web.Request) -> web.Response:
    model = await request.app[SERVICE].model(_uid(request))
    return web.json_response(model.to_dict())


async def _delete_model(request: web.Request) -> web.Response:
    return _action(await request.app[SERVICE].delete(_uid(request)))


async def _swap_in(request: web.Request) -> web.Response:
    return _action(await request.app[SERVICE].swap_in(_uid(request)))


async def _swap_out(request: web.Request) -> web.Response:
    return _action(await request.app[SERVICE].swap_out(_uid(request)))


#: `hostCopy` of a reload: keep the host copy (the client binds it only while its layout
#: fingerprint matches) or drop it (the model loads from its files).
HOST_COPY = {"keep": True, "drop": False}


async def _reload(request: web.Request) -> web.Response:
    uid = _uid(request)
    host_copy = request.query.get("hostCopy", "keep")
    if host_copy not in HOST_COPY:
        raise ModelError("hostCopy", f"Unsupported value: {host_copy[:40]!r}: keep or drop")
    service = request.app[SERVICE]
    return _action(await service.reload(uid, keep_host_copy=HOST_COPY[host_copy]))


async def _openapi(request: web.Request) -> web.Response:
    del request
    return web.Response(text=openapi_text(), content_type="application/yaml")


def _uid(request: web.Request) -> str:
    uid = request.match_info["uid"]
    check_uid(uid)
    return uid


def _action(result: ActionResult) -> web.Response:
    return web.json_response(result.to_dict(), status=409 if result.outcome == "refused" else 200)


# --- the grace-period timer ------------------------------------------------------------------


async def _unload_timer(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE]

    async def run() -> None:
        while True:
            await asyncio.sleep(service.settings.unload_check_interval_seconds)
            try:
                await service.unload_due()
            except Exception:
                logger.exception("unload check failed")

    task = asyncio.create_task(run(), name="control-unload-timer")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
