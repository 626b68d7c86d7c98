"""One client request for one model: which model, its wait for a swap-in (with progress
lines when asked), the call to Triton, and the answer in the form the client expects.

Progress: a request with `X-Modelswap-Progress: sse`, or a streaming request (v2
`generate_stream`, OpenAI `"stream": true`) that accepts `text/event-stream`, is answered
with an event stream as soon as it is admitted (a 429 is still a plain 429). While it
waits it gets comment lines:

    : swap-in queued position=3
    : swap-in RESTORING waited=1.0s position=3
    : swap-in done waited=1.4s

then its answer: a streaming request's own events; any other request's JSON body as one
`data:` event; an error as an `event: error` (v2) or a `data: {"error": ...}` (OpenAI) event.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from modelswap_sidecar.gateway import openai, shaping, sse
from modelswap_sidecar.gateway.context import Call, Flavour
from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.errors import BadRequestError, GatewayError, UnknownModelError
from modelswap_sidecar.gateway.http1 import Answer
from modelswap_sidecar.gateway.routing import Scope, scope_of, split_qualified
from modelswap_sidecar.gateway.upstream import model_path

logger = logging.getLogger(__name__)

PROGRESS_HEADER = "X-Modelswap-Progress"
STATE_HEADER = "X-Modelswap-State"
QUEUE_WAIT_HEADER = "X-Modelswap-Queue-Wait-Seconds"
#: Seconds a request waited in its prompt-length bucket (`shaping`), when it did.
SHAPING_WAIT_HEADER = "X-Modelswap-Shaping-Wait-Seconds"
#: when the gateway received the request (epoch seconds): with the queue wait, it splits a
#: client's latency into its way to the node, its wait for a swap-in and its service
RECEIVED_AT_HEADER = "X-Modelswap-Received-At"


def wants_progress(request: web.BaseRequest, *, streaming: bool) -> bool:
    if request.headers.get(PROGRESS_HEADER, "").strip().lower() == "sse":
        return True
    return streaming and sse.CONTENT_TYPE in request.headers.get("Accept", "")


def route_for(call: Call, model: str | None = None) -> ModelRoute:
    """The model `model` (by default the one the path names) names for this request (see
    `routing`); kept in the call for its metrics."""
    if model is None:
        model = call.model
        assert model is not None  # only model paths ask
    gw, request = call.gw, call.request
    prefix = call.namespace
    qualified, name = split_qualified(model) if call.flavour == "openai" else (None, model)
    if prefix is not None and qualified is not None and prefix != qualified:
        raise BadRequestError(
            f"model {model!r} names namespace {qualified!r} but the path names {prefix!r}"
        )
    if prefix is None and qualified is not None:
        scope = Scope(qualified, f"the model name {model!r}")
    else:
        scope = scope_of(prefix, request.headers.get("Host"), local_mode=gw.settings.local_mode)
    try:
        route = gw.directory.lookup(name, scope.namespace)
    except UnknownModelError as e:
        if scope.namespace is not None:
            e.message = f"{e.message} (namespace from {scope.origin})"
            e.args = (e.message,)
        raise
    call.route = route
    return route


class Exchange:
    def __init__(self, call: Call, route: ModelRoute, *, progress: bool) -> None:
        self.call = call
        self.gw = gw = call.gw
        self.request = call.request
        self.route = route
        self.progress = progress
        self.flavour: Flavour = call.flavour
        self.waited_seconds = 0.0
        #: it waited in a swap-in queue (its wait may read 0.000: uvloop's clock moves in
        #: whole milliseconds)
        self.queued = False
        self.received_at_seconds = gw.clock()
        #: A session-less generate request's prompt UTF-8 bytes: it waits in its bucket
        #: before Triton when the model shapes batches (`shaping`); None never waits.
        self.shape_prompt_bytes: int | None = None
        #: it waited in its bucket, and for how many seconds
        self.shaped = False
        self.shaped_seconds = 0.0
        self._stream: web.StreamResponse | None = None
        call.exchange = self

    @property
    def committed(self) -> bool:
        return self._stream is not None

    def record(self) -> None:
        self.gw.directory.record_request(self.route.uid, self.gw.clock())

    def _in_flight(self) -> None:
        """Count the request in flight once it is admitted or queued for the model's swap-in
        (`GatewayApp.handle` ends it)."""
        if not self.call.admitted:
            self.call.admitted = True
            self.gw.directory.request_started(self.route.uid)

    async def admit(self) -> None:
        """Return once the model serves: at once when resident, else after its swap-in.
        Raises QueueFullError before anything is sent; later errors too, unless a progress
        stream is open (then `fail` reports them in it)."""
        ticket = self.gw.queues.enter(self.route)
        # a waiter counts as in flight from here: the model it waits for is not idle once
        # swapped in, so no other swap-in takes it as an idle victim before the waiters
        # reach Triton (issue 26, item 7), nor a dropped model reloading for them (item 4)
        self._in_flight()
        if ticket is None:
            if self.progress:
                await self.stream()
            return
        started = self.gw.queues.now()
        self.queued = True
        try:
            if self.progress:
                await self.stream()
            if self._stream is None:
                await ticket.wait()
                return
            interval = self.gw.settings.progress_interval_seconds
            await self._comment(f"swap-in queued position={ticket.position}")
            while not await ticket.wait(interval):
                waited = self.gw.queues.now() - started
                state = self.gw.directory.swap_state(self.route.uid)
                await self._comment(
                    f"swap-in {state} waited={waited:.1f}s position={ticket.position}"
                )
            await self._comment(f"swap-in done waited={self.gw.queues.now() - started:.1f}s")
        finally:
            ticket.close()
            self.waited_seconds += self.gw.queues.now() - started

    async def forward(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        json_body: Any = None,
        headers: str = "",
    ) -> Answer:
        """Admit, then send to Triton (`path` under /v2/models/<triton name>); the caller
        releases the answer. A request that Triton refused because the model went away
        between admission and the call (it is not resident now) goes round once more."""
        self.record()
        target = model_path(self.route.triton_name, self.call.version, path)
        for attempt in (1, 2):
            await self.admit()
            prompt_bytes = self.shape_prompt_bytes if attempt == 1 else None
            if prompt_bytes is not None and self.route.shaping_wait_seconds > 0:
                # off, the request goes on as before: no wait, nothing awaited
                held = await self.gw.shaper.hold(self.route, prompt_bytes)
                self.shaped, self.shaped_seconds = True, held.seconds
                # the model batches the group's requests together (`shaping.tagged`)
                json_body, body = shaping.tagged(json_body, body, held.group)
            # from here it holds the model's work at Triton: a swap-out whose drain it
            # outlasts ends it (`GatewayApp.end_requests`)
            self.gw.at_triton.add(self.route.triton_name, self.call)
            response = await self.gw.upstream.open(
                method, target, body=body, json_body=json_body, headers=headers
            )
            if response.status < 400 or attempt == 2:
                return response
            if self.gw.directory.is_resident(self.route.uid):
                return response
            logger.info(
                "%s/%s went away before its request reached Triton; waiting again",
                self.route.namespace,
                self.route.name,
            )
            response.release()
        raise AssertionError("unreachable")

    def timing_headers(self, headers: dict[str, str]) -> dict[str, str]:
        """`headers` with the receipt time and any queue wait added."""
        headers[RECEIVED_AT_HEADER] = f"{self.received_at_seconds:.6f}"
        if self.queued:
            headers[QUEUE_WAIT_HEADER] = f"{self.waited_seconds:.3f}"
        if self.shaped:
            headers[SHAPING_WAIT_HEADER] = f"{self.shaped_seconds:.3f}"
        return headers

    async def stream(self) -> web.StreamResponse:
        """The event stream to the client, opened (200) if it was not already."""
        if self._stream is None:
            stream = web.StreamResponse(
                status=200, headers=self.timing_headers(dict(sse.STREAM_HEADERS))
            )
            await stream.prepare(self.request)
            self._stream = stream
        return self._stream

    async def write(self, data: bytes) -> None:
        stream = await self.stream()
        await stream.write(data)

    async def answer(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> web.StreamResponse:
        """A whole answer: as itself, or as one event when a progress stream is open."""
        self.call.code = status
        if self._stream is None:
            # one dict, with the content type in it: the Response's content_type setter
            # parses the header it writes
            out = {"Content-Type": content_type}
            if headers:
                out.update(headers)
            return web.Response(status=status, body=body, headers=self.timing_headers(out))
        if "json" not in content_type:
            message = "a binary answer cannot travel in a progress stream; ask without progress"
            return await self.fail(GatewayError(message))
        text = body.decode("utf-8", errors="replace")
        if status < 400 or self.flavour == "openai":
            await self._stream.write(sse.data_event(text))
        else:
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = {"error": text}
            event = {"status": status, **parsed} if isinstance(parsed, dict) else parsed
            await self._stream.write(sse.data_event(json.dumps(event), "error"))
        await self._stream.write_eof()
        return self._stream

    async def fail(self, error: GatewayError) -> web.StreamResponse:
        """Report `error`: raised to the error middleware when nothing was sent yet, else
        written into the open stream, which then ends."""
        if self._stream is None:
            raise error
        self.call.code = error.status
        if self.flavour == "openai":
            body: dict[str, Any] = openai.error_body(error.message, error.status, error.reason)
            await self._stream.write(sse.data_event(json.dumps(body)))
        else:
            body = {"error": error.message, "reason": error.reason, "status": error.status}
            if error.retry_after_seconds is not None:
                body["retry_after_seconds"] = error.retry_after_seconds
            await self._stream.write(sse.data_event(json.dumps(body), "error"))
        await self._stream.write_eof()
        return self._stream

    async def _comment(self, text: str) -> None:
        assert self._stream is not None
        await self._stream.write(sse.comment(text))
