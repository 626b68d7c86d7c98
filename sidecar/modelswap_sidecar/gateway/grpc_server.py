"""The gateway's gRPC front: Triton's `inference.GRPCInferenceService` on its own port, in
front of Triton's gRPC port, with the HTTP front's semantics (docs/GATEWAY.md, "gRPC").

    front = GrpcFront(app.gateway, GrpcSettings(upstream_target="127.0.0.1:8001", port=8001))
    port = await front.start()
    ...
    await front.stop()

It shares the HTTP front's `Gateway`: the same directory (request accounting), swap-in
queues (a burst of either protocol triggers one swap-in), metrics and the calls at Triton
that a swap-out's drain deadline ends. Served:

    ModelInfer              swaps a swapped-out model in (held in its queue, bounded)
    ModelStreamInfer        the same per request on the stream; decoupled models
    ServerLive/ServerReady  the gateway lives; ready: desired set known and Triton ready
    ModelReady              a swapped-out model is ready (it serves on request)
    ServerMetadata, ModelMetadata, ModelConfig, ModelStatistics   from Triton; a model's
                            do not wake it (UNAVAILABLE ModelSwappedOut when Triton does
                            not hold it); ModelStatistics with no name: every model in scope
    Repository*, *SharedMemory*, TraceSetting, LogSettings        UNIMPLEMENTED

Bounds: a ModelInfer request (and each of a stream's) is checked as the HTTP front checks a
v2 body, before any swap-in and before forwarding (`grpc_tensors.infer_request`, then the
model's configuration: `tensors.check_config`): INVALID_ARGUMENT `BadRequest` with HTTP's
message naming the input. `ServerMetadata` lists only the extensions this front serves
(`extensions.served_grpc` over `serves`).

Sessions: a conversation's session, named by the metadata `x-modelswap-session` or the
request parameter `session_id` (a string), reaches Triton as `session_id` scoped
`namespace/name/id`, as over HTTP (`generation.session_of`, docs/GATEWAY.md "Sessions").

Which model: the gRPC `:authority` is not visible to a grpcio server, so the namespace comes
from the model name written `namespace/name`, else from the request metadata
`modelswap-namespace`; a bare name resolves in local mode only (else INVALID_ARGUMENT
`NamespaceRequired`). A bare name held by several namespaces is FAILED_PRECONDITION
`AmbiguousModel` (HTTP's 409).

Errors: the HTTP status each `GatewayError` stands for becomes a gRPC code (`CODE_OF_STATUS`:
429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 404 NOT_FOUND, ...) with the same message; the
trailing metadata carries `modelswap-reason` (the HTTP `reason`) and, where HTTP sends
`Retry-After`, `retry-after` (seconds) and `grpc-retry-pushback-ms` (gRPC's own retry hint).
On a stream a refused request does not end the stream: it is answered in it, an
`error_message` `"<reason>: <message> (retry after <n>s)"` with the request's `id`.

Counted as HTTP counts: `modelswap_gateway_requests_total{code}` takes the HTTP status
each answer stands for (200, 429, 503, 499 for a client gone; a stream's requests each
count 200 when forwarded); a stream holds each model it named in flight until it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, cast

import grpc  # type: ignore[import-untyped]  # no stubs ship with grpcio
from tritonclient.grpc import service_pb2, service_pb2_grpc

from modelswap_sidecar.gateway import extensions, generation, grpc_tensors, tensors
from modelswap_sidecar.gateway.config_reads import read_model_config
from modelswap_sidecar.gateway.connections import grpc_max_connections, open_files_limit
from modelswap_sidecar.gateway.context import Call, Gateway
from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.errors import (
    AmbiguousModelError,
    BadRequestError,
    GatewayError,
    ModelSwappedOutError,
    NamespaceRequiredError,
    TritonRefusedError,
)
from modelswap_sidecar.gateway.grpc_forward import GrpcUpstream, TritonRpcError, forwarded_metadata
from modelswap_sidecar.gateway.routing import is_namespace, split_qualified, statistics_names
from modelswap_sidecar.triton.config import PARAMETER_PREFIX

logger = logging.getLogger(__name__)

T = TypeVar("T")

NAMESPACE_METADATA = "modelswap-namespace"
REASON_METADATA = "modelswap-reason"
STATE_METADATA = "modelswap-state"
RETRY_AFTER_METADATA = "retry-after"
RETRY_PUSHBACK_METADATA = "grpc-retry-pushback-ms"

#: The status counted for a call whose client went away (as the HTTP front).
CLIENT_GONE = 499

#: The gRPC code of each HTTP status the gateway answers with.
CODE_OF_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


@dataclass(frozen=True, kw_only=True)
class GrpcSettings:
    #: Triton's gRPC endpoint, `host:port`.
    upstream_target: str
    host: str = "0.0.0.0"
    #: 0: any free port (tests; `GrpcFront.start` says which).
    port: int = 8001
    #: Largest message either way (the HTTP front's body bound).
    max_message_bytes: int = 64 << 20
    #: Seconds a stopping server lets calls finish.
    stop_grace_seconds: float = 5.0
    #: Client connections held at once (None: `grpc_max_connections` of the open-files
    #: limit); gRPC core closes one over the cap as it is accepted.
    max_connections: int | None = None
    #: A connection with no call for this long is closed (GOAWAY: a client opens a new
    #: one for its next call), so idle connections cannot hold the cap for good.
    idle_close_seconds: float = 120.0
    #: A connection that has not finished HTTP/2's opening by then is closed.
    handshake_seconds: float = 10.0


class _Call:
    """One gRPC call as `context.AtTriton` sees it (it reads and writes only `at_triton`
    and `ended`), and what is counted of it."""

    __slots__ = ("admitted", "at_triton", "ended", "route")

    def __init__(self) -> None:
        self.route: ModelRoute | None = None
        self.admitted = False
        self.at_triton: str | None = None
        self.ended: GatewayError | None = None


def code_of(error: GatewayError) -> grpc.StatusCode:
    if isinstance(error, TritonRpcError):
        return error.code
    found = CODE_OF_STATUS.get(error.status)
    if found is not None:
        return found
    return grpc.StatusCode.INVALID_ARGUMENT if error.status < 500 else grpc.StatusCode.INTERNAL


def trailing_metadata(error: GatewayError) -> tuple[tuple[str, str], ...]:
    out = [(REASON_METADATA, error.reason)]
    if error.retry_after_seconds is not None:
        seconds = max(1, error.retry_after_seconds)
        out += [
            (RETRY_AFTER_METADATA, str(seconds)),
            (RETRY_PUSHBACK_METADATA, str(seconds * 1000)),
        ]
    return tuple(out)


#: The metadata naming a conversation's session (HTTP's `X-Modelswap-Session`, lower-cased
#: as gRPC metadata keys are).
SESSION_METADATA = generation.SESSION_HEADER.lower()


def scope_session(
    request: service_pb2.ModelInferRequest,
    route: ModelRoute,
    context: grpc.aio.ServicerContext[Any, Any],
) -> None:
    """The session the request names (metadata `x-modelswap-session`, else its string
    parameter `session_id`) put back in `session_id` scoped `namespace/name/id`; nothing
    when it names none. BadRequestError for a session that is not one."""
    metadata = {key: value for key, value in context.invocation_metadata() or ()}
    header = metadata.get(SESSION_METADATA)
    given: object = None
    name = generation.SESSION_PARAMETER
    if name in request.parameters:
        parameter = request.parameters[name]
        if parameter.WhichOneof("parameter_choice") != "string_param":
            raise BadRequestError(f"parameters.{name}: must be a string")
        given = parameter.string_param
    session = generation.session_of(
        header if isinstance(header, str) else None, given, f"parameters.{name}"
    )
    if session is not None:
        request.parameters[name].string_param = generation.scoped_session(route, session)


def _stream_message(error: GatewayError) -> str:
    text = f"{error.reason}: {error.message}"
    if error.retry_after_seconds is not None:
        text += f" (retry after {max(1, error.retry_after_seconds)}s)"
    return text


def _renamed(error: GatewayError, route: ModelRoute) -> GatewayError:
    error.message = error.message.replace(route.triton_name, route.name)
    error.args = (error.message,)
    return error


class GrpcFront(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The servicer and its server."""

    def __init__(self, gateway: Gateway, settings: GrpcSettings) -> None:
        self.gw = gateway
        self.settings = settings
        self.upstream = GrpcUpstream(
            settings.upstream_target,
            retry_after_seconds=gateway.settings.retry_after_seconds,
            max_message_bytes=settings.max_message_bytes,
        )
        self._server: grpc.aio.Server | None = None
        #: the port bound, once started
        self.port = 0

    async def start(self) -> int:
        """Listen; the bound port."""
        await self.upstream.start()
        settings = self.settings
        cap = settings.max_connections
        if cap is None:
            cap = grpc_max_connections(open_files_limit())
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", settings.max_message_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.max_allowed_incoming_connections", cap),
                ("grpc.max_connection_idle_ms", int(settings.idle_close_seconds * 1000)),
                ("grpc.server_handshake_timeout_ms", int(settings.handshake_seconds * 1000)),
            ]
        )
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self, server)
        port = server.add_insecure_port(f"{self.settings.host}:{self.settings.port}")
        if port == 0:
            await self.upstream.close()
            raise OSError(f"the gateway's gRPC port {self.settings.port} could not be bound")
        await server.start()
        self._server = server
        self.port = int(port)
        logger.info(
            "gateway gRPC on %s:%d in front of Triton's gRPC at %s; at most %d client connections",
            settings.host,
            port,
            settings.upstream_target,
            cap,
        )
        return int(port)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(self.settings.stop_grace_seconds)
            self._server = None
        await self.upstream.close()

    # -- one call: counted, errors answered ------------------------------------------------

    async def _serve(
        self, context: grpc.aio.ServicerContext[Any, Any], work: Callable[[_Call], Awaitable[T]]
    ) -> T:
        gw = self.gw
        metrics = gw.metrics
        metrics.in_flight_requests += 1
        call = _Call()
        code = 500
        try:
            result = await work(call)
            code = 200
            return result
        except GatewayError as e:
            code = e.status
            await _abort(context, e)
        except asyncio.CancelledError:
            ended = call.ended
            task = asyncio.current_task()
            # ended by `AtTriton.end` alone (not also by its client going away): answered
            if ended is None or task is None or task.uncancel() > 0:
                code = CLIENT_GONE
                raise
            code = ended.status
            await _abort(context, ended)
        except Exception:
            logger.exception("gRPC call failed")
            await _abort(context, GatewayError("the gateway failed to handle the request"))
        finally:
            gw.at_triton.discard(cast(Call, call))
            metrics.in_flight_requests -= 1
            metrics.answered(call.route, code)
            if call.admitted:
                assert call.route is not None
                gw.directory.request_finished(call.route.uid)

    def _route(self, model_name: str, context: grpc.aio.ServicerContext[Any, Any]) -> ModelRoute:
        """The model `model_name` names (see the module)."""
        qualified, name = split_qualified(model_name)
        named = _metadata_value(context, NAMESPACE_METADATA)
        if named is not None and not is_namespace(named):
            raise BadRequestError(f"{NAMESPACE_METADATA} {named[:100]!r} is not a namespace name")
        if qualified is not None and named is not None and qualified != named:
            raise BadRequestError(
                f"model {model_name!r} names namespace {qualified!r} but "
                f"{NAMESPACE_METADATA} names {named!r}"
            )
        namespace = qualified or named
        if not name:
            raise BadRequestError("no model_name")
        if namespace is None and not self.gw.settings.local_mode:
            raise NamespaceRequiredError(
                "no namespace: name the model <namespace>/<name> or send the "
                f"{NAMESPACE_METADATA} metadata"
            )
        try:
            return self.gw.directory.lookup(name, namespace)
        except AmbiguousModelError as e:
            e.message = e.message.replace(
                "prefix the path with /ns/<namespace>/ (or name the OpenAI model "
                "<namespace>/<name>)",
                f"name the model <namespace>/<name> or send the {NAMESPACE_METADATA} metadata",
            )
            e.args = (e.message,)
            raise

    async def _admit(self, call: _Call, route: ModelRoute) -> None:
        """Return once `route` serves (after its swap-in when it is swapped out)."""
        gw = self.gw
        ticket = gw.queues.enter(route)
        if not call.admitted:
            call.admitted = True
            gw.directory.request_started(route.uid)
        if ticket is None:
            return
        try:
            await ticket.wait()
        finally:
            ticket.close()

    async def _check_config(
        self, call: _Call, route: ModelRoute, inputs: tensors.InferRequest
    ) -> None:
        """The inputs against the model's configuration, as the HTTP front's
        (`v2._check_inputs`): before any swap-in when the configuration is known, else
        after it; only the message's bounds hold when Triton gives none the gateway reads."""
        gw = self.gw
        if gw.model_configs.get(route.triton_name) is None and not gw.directory.is_resident(
            route.uid
        ):
            await self._admit(call, route)
        try:
            config = await read_model_config(gw, route, lambda: self._admit(call, route))
        except TritonRefusedError as e:
            logger.info("no configuration of %s/%s to check against: %s", route.namespace,
                        route.name, e.message)  # fmt: skip
            return
        shape = tensors.model_shape(config)
        if shape is not None:
            tensors.check_config(inputs, shape, route.name)

    # -- inference ---------------------------------------------------------------------------

    async def ModelInfer(  # noqa: N802
        self, request: service_pb2.ModelInferRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> service_pb2.ModelInferResponse:
        async def work(call: _Call) -> service_pb2.ModelInferResponse:
            gw = self.gw
            route = call.route = self._route(request.model_name, context)
            if route.decoupled:
                raise BadRequestError(
                    f"{route.name} is a decoupled model: Triton serves it through "
                    "ModelStreamInfer only"
                )
            inputs = grpc_tensors.infer_request(request)
            scope_session(request, route, context)
            await self._check_config(call, route, inputs)
            gw.directory.record_request(route.uid, gw.clock())
            request.model_name = route.triton_name
            metadata = forwarded_metadata(context.invocation_metadata())
            for attempt in (1, 2):
                await self._admit(call, route)
                # from here it holds the model's work at Triton: a swap-out whose drain
                # it outlasts ends it (`GatewayApp.end_requests`)
                gw.at_triton.add(route.triton_name, cast(Call, call))
                try:
                    response = await self.upstream.call("ModelInfer", request, metadata)
                except TritonRpcError as e:
                    if attempt == 1 and not gw.directory.is_resident(route.uid):
                        logger.info("%s/%s went away before its request reached Triton; "
                                    "waiting again", route.namespace, route.name)  # fmt: skip
                        gw.at_triton.discard(cast(Call, call))
                        continue
                    gw.model_configs.forget(route.triton_name)  # it may have changed
                    raise _renamed(e, route) from e
                response.model_name = route.name
                return response
            raise AssertionError("unreachable")

        return await self._serve(context, work)

    async def ModelStreamInfer(  # noqa: N802
        self,
        request_iterator: AsyncIterator[service_pb2.ModelInferRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        stream = _Stream(self, context)
        gw = self.gw
        gw.metrics.in_flight_requests += 1
        try:
            await stream.run(request_iterator)
        except asyncio.CancelledError:
            ended = next((c.ended for c in stream.calls.values() if c.ended), stream.failure)
            task = asyncio.current_task()
            if ended is None or task is None or task.uncancel() > 0:
                raise
            await _abort(context, ended)
        finally:
            await stream.close()
            gw.metrics.in_flight_requests -= 1

    # -- server and model documents --------------------------------------------------------

    async def ServerLive(  # noqa: N802
        self, request: service_pb2.ServerLiveRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> service_pb2.ServerLiveResponse:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(  # noqa: N802
        self, request: service_pb2.ServerReadyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> service_pb2.ServerReadyResponse:
        if not self.gw.directory.knows_desired():
            return service_pb2.ServerReadyResponse(ready=False)
        try:
            answer = await self.upstream.call("ServerReady", request)
        except GatewayError:
            return service_pb2.ServerReadyResponse(ready=False)
        return service_pb2.ServerReadyResponse(ready=bool(answer.ready))

    async def ServerMetadata(  # noqa: N802
        self,
        request: service_pb2.ServerMetadataRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> service_pb2.ServerMetadataResponse:
        async def work(call: _Call) -> service_pb2.ServerMetadataResponse:
            del call
            answer: service_pb2.ServerMetadataResponse = await self.upstream.call(
                "ServerMetadata", request
            )
            kept = extensions.served_grpc(answer.extensions, serves)
            del answer.extensions[:]
            answer.extensions.extend(kept)
            return answer

        return await self._serve(context, work)

    async def ModelReady(  # noqa: N802
        self, request: service_pb2.ModelReadyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> service_pb2.ModelReadyResponse:
        async def work(call: _Call) -> service_pb2.ModelReadyResponse:
            route = call.route = self._route(request.name, context)
            state = self.gw.directory.swap_state(route.uid)
            context.set_trailing_metadata(((STATE_METADATA, state),))
            if not self.gw.directory.is_resident(route.uid):
                return service_pb2.ModelReadyResponse(ready=True)
            request.name = route.triton_name
            try:
                answer: service_pb2.ModelReadyResponse = await self.upstream.call(
                    "ModelReady", request
                )
            except TritonRpcError as e:
                raise _renamed(e, route) from e
            return answer

        return await self._serve(context, work)

    async def ModelMetadata(  # noqa: N802
        self, request: service_pb2.ModelMetadataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> service_pb2.ModelMetadataResponse:
        async def work(call: _Call) -> service_pb2.ModelMetadataResponse:
            route = call.route = self._route(request.name, context)
            request.name = route.triton_name
            answer: service_pb2.ModelMetadataResponse = await self._document(
                route, "ModelMetadata", request, "metadata"
            )
            answer.name = route.name
            return answer

        return await self._serve(context, work)

    async def ModelConfig(  # noqa: N802
        self, request: service_pb2.ModelConfigRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> service_pb2.ModelConfigResponse:
        async def work(call: _Call) -> service_pb2.ModelConfigResponse:
            route = call.route = self._route(request.name, context)
            request.name = route.triton_name
            answer: service_pb2.ModelConfigResponse = await self._document(
                route, "ModelConfig", request, "configuration"
            )
            answer.config.name = route.name
            # how a model reaches the agent is none of a caller's business (DESIGN.md §1)
            for key in [k for k in answer.config.parameters if k.startswith(PARAMETER_PREFIX)]:
                del answer.config.parameters[key]
            return answer

        return await self._serve(context, work)

    async def ModelStatistics(  # noqa: N802
        self,
        request: service_pb2.ModelStatisticsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> service_pb2.ModelStatisticsResponse:
        async def work(call: _Call) -> service_pb2.ModelStatisticsResponse:
            if request.name:
                route = call.route = self._route(request.name, context)
                request.name = route.triton_name
                answer: service_pb2.ModelStatisticsResponse = await self._document(
                    route, "ModelStatistics", request, "statistics"
                )
                for stats in answer.model_stats:
                    stats.name = route.name
                return answer
            return await self._every_statistics(request, context)

        return await self._serve(context, work)

    async def _every_statistics(
        self,
        request: service_pb2.ModelStatisticsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> service_pb2.ModelStatisticsResponse:
        """Every model in the request's scope Triton holds, under `namespace/name`."""
        named = _metadata_value(context, NAMESPACE_METADATA)
        if named is None and not self.gw.settings.local_mode:
            raise NamespaceRequiredError(
                f"no namespace: send the {NAMESPACE_METADATA} metadata to read every model's "
                "statistics"
            )
        names = statistics_names(self.gw.directory.routes(named))
        answer: service_pb2.ModelStatisticsResponse = await self.upstream.call(
            "ModelStatistics", request
        )
        kept = service_pb2.ModelStatisticsResponse()
        for stats in answer.model_stats:
            name = names.get(stats.name)
            if name is not None:
                stats.name = name
                kept.model_stats.append(stats)
        return kept

    async def _document(self, route: ModelRoute, method: str, request: Any, what: str) -> Any:
        """A model's document from Triton; none of these wakes it."""
        try:
            return await self.upstream.call(method, request)
        except TritonRpcError as e:
            if not self.gw.directory.is_resident(route.uid):
                raise ModelSwappedOutError(
                    f"{route.namespace}/{route.name} is swapped out; its {what} is served "
                    "again after its next inference",
                    retry_after_seconds=self.gw.settings.retry_after_seconds,
                ) from e
            raise _renamed(e, route) from e


_NO_SHARED_MEMORY = (
    "shared memory is not served through the gateway: Triton and the client would share "
    "the node's memory, which a client of the gateway does not; send tensors in the request"
)

_NO_REPOSITORY = (
    "Triton's repository API is not exposed: models are placed by their ModelDeployments"
)

#: The calls the front answers UNIMPLEMENTED, and why (the generated servicer's own answer
#: names no reason); `serves` leaves them out of `ServerMetadata`'s extensions.
REFUSED: dict[str, str] = {
    "RepositoryIndex": _NO_REPOSITORY,
    "RepositoryModelLoad": _NO_REPOSITORY,
    "RepositoryModelUnload": _NO_REPOSITORY,
    "SystemSharedMemoryStatus": _NO_SHARED_MEMORY,
    "SystemSharedMemoryRegister": _NO_SHARED_MEMORY,
    "SystemSharedMemoryUnregister": _NO_SHARED_MEMORY,
    "CudaSharedMemoryStatus": _NO_SHARED_MEMORY,
    "CudaSharedMemoryRegister": _NO_SHARED_MEMORY,
    "CudaSharedMemoryUnregister": _NO_SHARED_MEMORY,
    "TraceSetting": "Triton's trace settings are the node's, not a client's",
    "LogSettings": "Triton's log settings are the node's, not a client's",
}


def _refuse_with(reason: str) -> Callable[..., Any]:
    async def refuse(
        self: GrpcFront, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        await _unimplemented(context, reason)

    return refuse


for _method, _reason in REFUSED.items():
    setattr(GrpcFront, _method, _refuse_with(_reason))


class _Stream:
    """One `ModelStreamInfer` call: its requests admitted one after another, in order, and
    sent on one stream to Triton (opened at the first); Triton's answers, and the gateway's
    refusals of single requests, written back by one writer task."""

    def __init__(self, front: GrpcFront, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.front = front
        self.gw = front.gw
        self.context = context
        #: per model named on the stream, by uid: its accounting and its place at Triton
        self.calls: dict[str, _Call] = {}
        self._to_triton: asyncio.Queue[service_pb2.ModelInferRequest | None] = asyncio.Queue()
        self._out: asyncio.Queue[service_pb2.ModelStreamInferResponse | None] = asyncio.Queue()
        self._routes: dict[str, ModelRoute] = {}  # by Triton name
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._upstream: Any = None
        #: why the stream to Triton broke, once it did
        self.failure: GatewayError | None = None
        #: the handler's task while it still reads the client's requests: the stream to
        #: Triton breaking cancels it there (a client that sends nothing more would not
        #: learn of it otherwise), and `ModelStreamInfer` answers `failure`
        self._feeding: asyncio.Task[Any] | None = None

    async def run(self, requests: AsyncIterator[service_pb2.ModelInferRequest]) -> None:
        self._writer = asyncio.create_task(self._write())
        self._feeding = asyncio.current_task()
        metadata = forwarded_metadata(self.context.invocation_metadata())
        async for request in requests:
            if self.failure is not None:
                break
            try:
                route = await self._admit(request)
            except GatewayError as e:
                self.gw.metrics.answered(self.front_route(request), e.status)
                await self._out.put(_refusal(request, e))
                continue
            request.model_name = route.triton_name
            if self._upstream is None:
                self._upstream = self.front.upstream.stream(self._requests(), metadata)
                self._reader = asyncio.create_task(self._read())
            await self._to_triton.put(request)
            self.gw.metrics.answered(route, 200)
        self._feeding = None
        await self._to_triton.put(None)  # half-close towards Triton: it ends after its answers
        if self._reader is not None:
            await self._reader
        await self._out.put(None)
        await self._writer
        if self.failure is not None:
            await _abort(self.context, self.failure)

    def front_route(self, request: service_pb2.ModelInferRequest) -> ModelRoute | None:
        with contextlib.suppress(GatewayError):
            return self.front._route(request.model_name, self.context)
        return None

    async def _admit(self, request: service_pb2.ModelInferRequest) -> ModelRoute:
        route = self.front._route(request.model_name, self.context)
        inputs = grpc_tensors.infer_request(request)
        scope_session(request, route, self.context)
        call = self.calls.get(route.uid)
        if call is None:
            call = self.calls[route.uid] = _Call()
            call.route = route
        await self.front._check_config(call, route, inputs)
        self.gw.directory.record_request(route.uid, self.gw.clock())
        await self.front._admit(call, route)
        self.gw.at_triton.add(route.triton_name, cast(Call, call))
        self._routes[route.triton_name] = route
        return route

    async def _requests(self) -> AsyncIterator[service_pb2.ModelInferRequest]:
        while True:
            request = await self._to_triton.get()
            if request is None:
                return
            yield request

    async def _read(self) -> None:
        try:
            async for answer in self._upstream:
                response = answer.infer_response
                route = self._routes.get(response.model_name)
                if route is not None:
                    response.model_name = route.name
                    if answer.error_message:
                        answer.error_message = answer.error_message.replace(
                            route.triton_name, route.name
                        )
                await self._out.put(answer)
        except grpc.aio.AioRpcError as e:
            self.failure = self.front.upstream.error_of(e, "ModelStreamInfer")
            if self._feeding is not None:
                self._feeding.cancel(self.failure.message)

    async def _write(self) -> None:
        while True:
            answer = await self._out.get()
            if answer is None:
                return
            await self.context.write(answer)

    async def close(self) -> None:
        for task in (self._reader, self._writer):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._upstream is not None:
            self._upstream.cancel()
        gw = self.gw
        now = gw.clock()
        for call in self.calls.values():
            gw.at_triton.discard(cast(Call, call))
            assert call.route is not None
            gw.directory.record_request(call.route.uid, now)  # a stream's end is use too
            if call.admitted:
                gw.directory.request_finished(call.route.uid)


def _refusal(
    request: service_pb2.ModelInferRequest, error: GatewayError
) -> service_pb2.ModelStreamInferResponse:
    return service_pb2.ModelStreamInferResponse(
        error_message=_stream_message(error),
        infer_response=service_pb2.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id
        ),
    )


def serves(method: str) -> bool:
    """`GrpcFront` answers `method` (an RPC of `inference.GRPCInferenceService`): it
    defines it, and not as a refusal (`REFUSED`). `ServerMetadata`'s extensions follow."""
    return method in GrpcFront.__dict__ and method not in REFUSED


def _metadata_value(context: grpc.aio.ServicerContext[Any, Any], key: str) -> str | None:
    for name, value in context.invocation_metadata() or ():
        if name == key and isinstance(value, str):
            return value
    return None


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: GatewayError) -> NoReturn:
    await context.abort(code_of(error), error.message, trailing_metadata(error))
    raise AssertionError("unreachable")  # abort raises


async def _unimplemented(context: grpc.aio.ServicerContext[Any, Any], message: str) -> NoReturn:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)
    raise AssertionError("unreachable")
