"""The gateway's gRPC front holds a capped number of client connections (docs/GATEWAY.md,
"Connection caps"): the HTTP front's caps did not cover it, so a flood of gRPC connections
could take the file descriptors the engine needs.

- connections over `max_connections` are closed as they are accepted, those under it are
  served; a client refused while the flood holds the cap gets UNAVAILABLE, and is served
  once the flood's idle connections are closed (`idle_close_seconds`) or it goes;
- a connection that never finishes HTTP/2's opening is closed after `handshake_seconds`;
- unset, the cap is derived from the open-files limit, out of the gateway's reserve.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2, service_pb2_grpc

from modelswap_sidecar.gateway.app import make_app
from modelswap_sidecar.gateway.connections import grpc_max_connections
from modelswap_sidecar.gateway.grpc_server import GrpcFront, GrpcSettings
from modelswap_sidecar.gateway.settings import GatewaySettings
from modelswap_sidecar.triton.process import free_loopback_port
from tests.support.gateway_fakes import FakeDirectory
from tests.support.waiting import until_async

CAP = 4
#: HTTP/2's connection preface and an empty SETTINGS frame: what a gRPC client sends first.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
#: Far above how long gRPC core takes to close a connection it refuses or times out.
CLOSED_WITHIN_SECONDS = 20.0


@contextlib.asynccontextmanager
async def front(*, idle_close_seconds: float = 120.0) -> AsyncIterator[int]:
    """The gRPC front capped at `CAP` connections (its upstream never reached: the calls
    here are answered by the front itself); yields its port."""
    dead = free_loopback_port()
    settings = GatewaySettings(upstream_url=f"http://127.0.0.1:{dead}")
    app = make_app(FakeDirectory([]), settings, registry=CollectorRegistry())
    grpc_front = GrpcFront(
        app.gateway,
        GrpcSettings(
            upstream_target=f"127.0.0.1:{free_loopback_port()}",
            host="127.0.0.1",
            port=0,
            max_connections=CAP,
            idle_close_seconds=idle_close_seconds,
            handshake_seconds=1.0,
        ),
    )
    port = await grpc_front.start()
    try:
        yield port
    finally:
        await grpc_front.stop()
        await app.gateway.queues.close()


async def open_raw(
    port: int, *, preface: bool = True
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if preface:
        writer.write(PREFACE)
        await writer.drain()
    return reader, writer


async def closed_by_server(reader: asyncio.StreamReader, within_seconds: float) -> bool:
    """True when the server closes the connection within the time (its SETTINGS and any
    GOAWAY read and dropped), False when it is still open then."""
    try:
        async with asyncio.timeout(within_seconds):
            while await reader.read(4096):
                pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


async def served(port: int) -> bool:
    return await live(port) == grpc.StatusCode.OK


async def live(port: int) -> grpc.StatusCode:
    """A new client's ServerLive: OK, or the code it failed with."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            await stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=5)
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


@pytest.mark.asyncio
async def test_connections_over_the_cap_are_closed_and_a_client_served_once_they_go() -> None:
    async with front() as port:
        flood = [await open_raw(port) for _ in range(CAP + 6)]
        try:
            closed = await asyncio.gather(*(closed_by_server(r, 3.0) for r, _ in flood))
            assert closed.count(False) == CAP, closed  # held: the first CAP accepted
            assert await live(port) == grpc.StatusCode.UNAVAILABLE
        finally:
            for _, writer in flood:
                writer.close()
        # The flood gone, a client is served (gRPC core counts a closed connection out
        # once it has read the close).
        await until_async(lambda: served(port), "a client served", CLOSED_WITHIN_SECONDS)


@pytest.mark.asyncio
async def test_idle_connections_holding_the_cap_are_closed_and_clients_served_again() -> None:
    async with front(idle_close_seconds=1.0) as port:
        flood = [await open_raw(port) for _ in range(CAP)]
        try:
            assert await live(port) == grpc.StatusCode.UNAVAILABLE
            closed = await asyncio.gather(
                *(closed_by_server(r, CLOSED_WITHIN_SECONDS) for r, _ in flood)
            )
            assert all(closed), closed  # idle past idle_close_seconds: GOAWAY and closed
            await until_async(lambda: served(port), "a client served", CLOSED_WITHIN_SECONDS)
        finally:
            for _, writer in flood:
                writer.close()


@pytest.mark.asyncio
async def test_a_connection_that_never_opens_http2_is_closed() -> None:
    async with front() as port:
        reader, writer = await open_raw(port, preface=False)
        try:
            assert await closed_by_server(reader, CLOSED_WITHIN_SECONDS)
        finally:
            writer.close()


def test_the_default_cap_comes_from_the_open_files_limit() -> None:
    assert grpc_max_connections(1024) == 32
    assert grpc_max_connections(4096) == 128
    assert grpc_max_connections(1 << 20) == 128  # at most 128, however high the limit
    assert grpc_max_connections(64) == 4  # at least a few
