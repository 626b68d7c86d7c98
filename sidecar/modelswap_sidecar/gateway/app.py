"""The gateway's server: KServe v2 (`v2`) and OpenAI (`openai_handlers`,
`embeddings_handlers`) routes in front of Triton, served on its own port.

    app = make_app(directory, settings, registry=registry)
    runner = await start(app)          # listening on settings.host:settings.port
    ...
    await runner.cleanup()             # closes the swap-in queues and the connections to Triton

It is aiohttp's low-level server (`web.Server`): aiohttp parses requests and writes
answers, and `GatewayApp.handle` is the one handler, with no application, router,
middleware or signals per request; the gateway's own `paths.PathTable` says which
endpoint a path names. Handler cancellation is on: a client that goes away cancels its
handler (and frees its place in a swap-in queue); a handler cancelled while it waits on
Triton closes its connection to Triton, and Triton cancels the request
(`request.is_cancelled()` in a python-backend model). `end_requests` cancels a model's
requests at Triton the same way when its swap-out's drain deadline passes, and answers
them 503 `DrainDeadline`.

Errors are answered as `{"error": message, "reason": reason}` on v2 routes and as OpenAI
error objects on `/v1` routes, with `Retry-After` on 429 and 503 refusals. Whole answers
(not event streams) are compressed when the client asks (`compression`).

Client connections are capped (`connections`: `GatewaySettings.max_connections` in all,
`max_connections_per_address` from one address, read against the open-files limit when the
server starts): at a cap the longest-idle connections are closed to admit new ones, and a
connection refused while none is idle has its request answered 503 `TooManyConnections`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import HttpVersion11, web
from aiohttp.log import server_logger
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CollectorRegistry

from modelswap_sidecar.gateway import embeddings_handlers, openai, openai_handlers, v2
from modelswap_sidecar.gateway.compression import compressed
from modelswap_sidecar.gateway.connections import (
    ConnectionLimiter,
    open_fds,
    open_files_limit,
    plan_caps,
)
from modelswap_sidecar.gateway.context import Call, Gateway, Handler
from modelswap_sidecar.gateway.directory import ModelDirectory
from modelswap_sidecar.gateway.errors import (
    AmbiguousModelError,
    ExpectationFailedError,
    GatewayError,
    MethodNotAllowedError,
    RequestEndedError,
    RouteNotFoundError,
)
from modelswap_sidecar.gateway.exchange import Exchange
from modelswap_sidecar.gateway.metrics import ConnectionCollector, GatewayMetrics
from modelswap_sidecar.gateway.parse_errors import ParseErrorLog
from modelswap_sidecar.gateway.paths import PathTable
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

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class GatewayApp:
    """The gateway's state and its one request handler."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.paths: PathTable[Handler] = PathTable()
        v2.add_routes(self.paths)
        openai_handlers.add_routes(self.paths)
        embeddings_handlers.add_routes(self.paths)
        #: the server's connection caps, from `start`
        self.limiter: ConnectionLimiter | None = None
        #: connections refused at a cap, whose request is answered 503 (the limiter's)
        self.refusing: set[RequestHandler] = set()
        gateway.metrics.registry.register(ConnectionCollector(lambda: self.limiter))

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Route the request, answer errors, count it by model and status."""
        refusing = self.refusing
        if refusing and request.protocol in refusing:
            return self._refuse_connection(request)
        gw = self.gateway
        metrics = gw.metrics
        metrics.in_flight_requests += 1
        call = Call(gw, request)
        code = 500
        try:
            handler = self._route(call)
            if "Expect" in request.headers:
                await _expect(request)
            response = await handler(call)
            code = call.code or response.status
            return await compressed(request, response)
        except GatewayError as e:
            code = e.status
            return await compressed(request, error_response(call, e))
        except web.HTTPException as e:
            code = e.status
            if e.status < 400:
                raise
            return await compressed(request, error_response(call, _http_error(e)))
        except asyncio.CancelledError:
            ended = call.ended
            task = asyncio.current_task()
            # ended by `end_requests` alone (not also by its client going away): answered
            if ended is None or task is None or task.uncancel() > 0:
                code = CLIENT_GONE
                raise
            code = ended.status
            return await _answer_ended(call, ended)
        except ConnectionResetError:
            code = CLIENT_GONE
            raise
        except Exception:
            logger.exception("%s %s failed", request.method, request.path)
            return error_response(call, GatewayError("the gateway failed to handle the request"))
        finally:
            gw.at_triton.discard(call)
            metrics.in_flight_requests -= 1
            metrics.answered(call.route, code)
            if call.admitted:
                assert call.route is not None
                gw.directory.request_finished(call.route.uid)

    def _refuse_connection(self, request: web.BaseRequest) -> web.StreamResponse:
        """A connection over a cap with none idle to close: 503, and the connection closes."""
        call = Call(self.gateway, request)
        limiter = self.limiter
        assert limiter is not None
        error = GatewayError(
            f"the gateway holds its most connections ({limiter.caps.max_connections} in all, "
            f"{limiter.caps.max_connections_per_address} from one address), all busy; "
            "retry later",
            retry_after_seconds=self.gateway.settings.retry_after_seconds,
        )
        error.status, error.reason = 503, "TooManyConnections"
        if "/v1/" in request.path:
            call.flavour = "openai"
        response = error_response(call, error)
        response.force_close()
        self.gateway.metrics.answered(None, error.status)
        return response

    def end_requests(self, triton_name: str, why: str) -> int:
        """End every request at Triton for the model `triton_name` (its connection to
        Triton closes: Triton cancels it); each is answered 503 `DrainDeadline` with
        Retry-After and `why`. The number ended."""
        gw = self.gateway
        error = RequestEndedError(why, retry_after_seconds=gw.settings.retry_after_seconds)
        ended = gw.at_triton.end(triton_name, error)
        if ended:
            logger.warning("ended %d request(s) at Triton for %s: %s", ended, triton_name, why)
        return ended

    def _route(self, call: Call) -> Handler:
        request = call.request
        found = self.paths.match(request.rel_url.path_safe)
        if found is None:
            raise RouteNotFoundError(f"no such path: {request.path[:200]}")
        endpoint = found.endpoint
        call.flavour = endpoint.flavour
        if request.method != endpoint.method:
            raise MethodNotAllowedError(
                f"{request.method[:20]} is not allowed on this path; use {endpoint.method}"
            )
        call.namespace, call.model, call.version = found.namespace, found.model, found.version
        return endpoint.handler


async def _answer_ended(call: Call, error: GatewayError) -> web.StreamResponse:
    """An ended call's answer: in its stream when one is open, else a plain error."""
    exchange = call.exchange
    if isinstance(exchange, Exchange) and exchange.committed:
        try:
            return await exchange.fail(error)
        except (ConnectionResetError, RuntimeError):
            # the stream had just ended (its last write came first) or its client left
            return await exchange.stream()
    return error_response(call, error)


async def _expect(request: web.BaseRequest) -> None:
    """`Expect: 100-continue` is answered `100 Continue` before the body is read (curl asks
    so before a large body); any other expectation is a 417, as aiohttp's router did."""
    expect = request.headers.get("Expect", "")
    if request.version != HttpVersion11:
        return
    if expect.lower() != "100-continue":
        raise ExpectationFailedError(f"unknown Expect: {expect[:100]}")
    await request.writer.write(_CONTINUE)
    request.writer.output_size = 0  # the answer's size does not count the interim one


def make_app(
    directory: ModelDirectory,
    settings: GatewaySettings,
    *,
    registry: CollectorRegistry,
    clock: Callable[[], float] = time.time,
) -> GatewayApp:
    """The gateway over `directory`; its metrics go to `registry`; `clock` gives epoch
    seconds (last-request times, OpenAI `created`)."""
    metrics = GatewayMetrics(registry)
    queues = SwapInQueues(
        directory, retry_after_seconds=settings.retry_after_seconds, observer=metrics
    )
    metrics.register_queue_depth(queues.depths)
    return GatewayApp(
        Gateway(
            directory=directory,
            settings=settings,
            queues=queues,
            upstream=Upstream(settings),
            metrics=metrics,
            clock=clock,
        )
    )


class GatewayRunner(web.BaseRunner):
    """Serves a `GatewayApp`: the connections to Triton open with the server; on cleanup,
    after the server stopped, the swap-in queues and those connections close."""

    def __init__(self, app: GatewayApp, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.app = app

    async def shutdown(self) -> None:
        pass

    async def _make_server(self) -> web.Server:
        await self.app.gateway.upstream.start()
        server = web.Server(self.app.handle, handler_cancellation=True, **self._kwargs)
        if self.app.limiter is not None:
            self.app.limiter.attach(server)
        return server

    async def _cleanup_server(self) -> None:
        await self.app.gateway.queues.close()
        await self.app.gateway.upstream.close()


async def start(app: GatewayApp) -> GatewayRunner:
    """Serve `app` on its settings' host and port (port 0: any free one, see `bound_port`);
    the caller cleans the runner up. `connections.CapsError` (naming the field) when the
    configured connection caps do not fit the open-files limit."""
    settings = app.gateway.settings
    caps = plan_caps(
        limit=open_files_limit(),
        open_now=open_fds(),
        max_connections=settings.max_connections,
        max_connections_per_address=settings.max_connections_per_address,
        reserve_file_descriptors=settings.reserve_file_descriptors,
    )
    app.limiter = ConnectionLimiter(
        caps, server="gateway", setting="gateway.maxConnections", answers_refusals=True
    )
    app.refusing = app.limiter.refusing
    # Bodies are decoded by `bodies.read_body`, in bounded steps (aiohttp would inflate a
    # gzip bomb inside the event loop); the keep-alive timer also bounds a connection that
    # trickles its headers, since it is not reset by bytes of an unfinished request.
    runner = GatewayRunner(
        app,
        auto_decompress=False,
        keepalive_timeout=settings.idle_timeout_seconds,
        access_log=None,  # none per request (the agent's logging never wanted it)
        # a request aiohttp cannot parse: one line now and then, not a traceback each
        logger=ParseErrorLog(server_logger),
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=LISTEN_BACKLOG)
    await site.start()
    logger.info(
        "gateway on %s:%d in front of %s; at most %d client connections, %d from one address",
        settings.host,
        bound_port(runner),
        settings.upstream_url,
        caps.max_connections,
        caps.max_connections_per_address,
    )
    return runner


def bound_port(runner: web.BaseRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    raise RuntimeError("the gateway is not listening on TCP")


def error_response(call: Call, error: GatewayError) -> web.Response:
    headers = {}
    if error.retry_after_seconds is not None:
        headers["Retry-After"] = str(max(1, error.retry_after_seconds))
    if call.flavour == "openai":
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


def _http_error(e: web.HTTPException) -> GatewayError:
    error = GatewayError(e.text or e.reason)
    error.status = e.status
    error.reason = e.reason.replace(" ", "")
    return error
