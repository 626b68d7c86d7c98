"""The gateway's aiohttp application: KServe v2 (`v2`) and OpenAI (`openai_handlers`)
routes in front of Triton, served on its own port with `handler_cancellation=True`, so a
client that goes away cancels its handler (and frees its place in a swap-in queue).

    app = make_app(directory, settings, registry=registry)
    runner = await start(app)          # listening on settings.host:settings.port
    ...
    await runner.cleanup()             # closes the connections to Triton

Errors are answered as `{"error": message, "reason": reason}` on v2 routes and as OpenAI
error objects on `/v1` routes, with `Retry-After` on 429 and 503 refusals.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from modelswap_sidecar.gateway import openai, openai_handlers, v2
from modelswap_sidecar.gateway.context import GATEWAY, Gateway
from modelswap_sidecar.gateway.directory import ModelDirectory
from modelswap_sidecar.gateway.errors import AmbiguousModelError, GatewayError
from modelswap_sidecar.gateway.exchange import CODE, FLAVOUR, IN_FLIGHT, ROUTE
from modelswap_sidecar.gateway.metrics import GatewayMetrics
from modelswap_sidecar.gateway.queueing import SwapInQueues
from modelswap_sidecar.gateway.settings import GatewaySettings
from modelswap_sidecar.gateway.upstream import Upstream

logger = logging.getLogger(__name__)

#: Connections the kernel holds for the gateway before it accepts them (capped by
#: net.core.somaxconn). aiohttp's 128 overflowed when a thousand clients connected at once:
#: the kernel dropped their handshakes and, on a busy node, reset some of them.
LISTEN_BACKLOG = 4096

#: The status counted for a request whose client went away (nginx's convention).
CLIENT_GONE = 499

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(
    directory: ModelDirectory,
    settings: GatewaySettings,
    *,
    registry: CollectorRegistry,
    clock: Callable[[], float] = time.time,
) -> web.Application:
    """The gateway over `directory`; its metrics go to `registry`; `clock` gives epoch
    seconds (last-request times, OpenAI `created`)."""
    metrics = GatewayMetrics(registry)
    queues = SwapInQueues(
        directory, retry_after_seconds=settings.retry_after_seconds, observer=metrics
    )
    metrics.register_queue_depth(queues.depths)
    gateway = Gateway(
        directory=directory,
        settings=settings,
        queues=queues,
        upstream=Upstream(settings),
        metrics=metrics,
        clock=clock,
    )
    app = web.Application(middlewares=[_observe], client_max_size=settings.max_body_bytes)
    app[GATEWAY] = gateway
    v2.add_routes(app)
    openai_handlers.add_routes(app)
    app.cleanup_ctx.append(_lifetime)
    return app


async def start(app: web.Application) -> web.AppRunner:
    """Serve `app` on its settings' host and port (port 0: any free one, see `bound_port`);
    the caller cleans the runner up."""
    settings = app[GATEWAY].settings
    # Bodies are decoded by `bodies.read_body`, in bounded steps (aiohttp would inflate a
    # gzip bomb inside the event loop); the keep-alive timer also bounds a connection that
    # trickles its headers, since it is not reset by bytes of an unfinished request.
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        auto_decompress=False,
        keepalive_timeout=settings.idle_timeout_seconds,
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=LISTEN_BACKLOG)
    await site.start()
    logger.info(
        "gateway on %s:%d in front of %s", settings.host, bound_port(runner), settings.upstream_url
    )
    return runner


def bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    raise RuntimeError("the gateway is not listening on TCP")


async def _lifetime(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY]
    await gateway.upstream.start()
    yield
    await gateway.queues.close()
    await gateway.upstream.close()


def error_response(request: web.Request, error: GatewayError) -> web.Response:
    headers = {}
    if error.retry_after_seconds is not None:
        headers["Retry-After"] = str(max(1, error.retry_after_seconds))
    if request.get(FLAVOUR) == "openai":
        body = openai.error_body(error.message, error.status, error.reason)
    else:
        body = {"error": error.message, "reason": error.reason}
        if isinstance(error, AmbiguousModelError):
            body["candidates"] = list(error.candidates)
    return web.Response(
        status=error.status,
        text=json.dumps(body),
        content_type="application/json",
        headers=headers,
    )


@web.middleware
async def _observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Errors into answers; every request counted by model and status."""
    gateway = request.app[GATEWAY]
    gateway.metrics.in_flight.inc()
    code = 500
    try:
        response = await handler(request)
        code = request.get(CODE, response.status)
        return response
    except GatewayError as e:
        code = e.status
        return error_response(request, e)
    except web.HTTPException as e:
        code = e.status
        if e.status < 400:
            raise
        return error_response(request, _http_error(e))
    except (asyncio.CancelledError, ConnectionResetError):
        code = CLIENT_GONE
        raise
    except Exception:
        logger.exception("%s %s failed", request.method, request.path)
        return error_response(request, GatewayError("the gateway failed to handle the request"))
    finally:
        gateway.metrics.in_flight.dec()
        gateway.metrics.answered(request.get(ROUTE), code)
        admitted = request.get(IN_FLIGHT)
        if admitted is not None:
            gateway.directory.request_finished(admitted)


def _http_error(e: web.HTTPException) -> GatewayError:
    error = GatewayError(e.text or e.reason)
    error.status = e.status
    error.reason = e.reason.replace(" ", "")
    return error
