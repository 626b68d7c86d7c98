"""Running the agent: `run_agent(settings)` builds it (`assembly.build`) and runs it
(`run`) until SIGTERM or SIGINT, then closes everything it opened; `serve(settings)` does
that on the agent's event loop (`new_event_loop`: uvloop's).

`run(agent, stop)` reads the saved desired set's names (`core.knowledge`: until the agent
knows its desired models the gateway answers 503, not 404), then starts, in order: the
control API (HTTPS with the serving certificate
when one was picked), the metrics and gateway servers when their ports are set, the runtime
watch, the policy loop, the adoption of the models a previous agent held and the event
loop's lag watch (`loop_lag`); writes the
endpoints file (`agent.json`: pid and the ports bound); then, in cluster mode, the node
heartbeat (SwapNode + node Lease) until `stop` is set.

Triton itself is not started here: the supervisor (or local mode, or a test) runs it and
tells the agent its pid through the pid source. A setting that cannot work here (cuda-vmm
without a usable GPU, a kubeconfig that does not load, a configured serving certificate
that does not load) ends `run_agent` with one line on stderr naming it and status 2,
before anything is started.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import uvloop
from aiohttp import web

from modelswap_sidecar.agent.assembly import DESIRED_FILE, Agent, build
from modelswap_sidecar.agent.core.adoption import adopt
from modelswap_sidecar.agent.errors import StartupError
from modelswap_sidecar.agent.loop_lag import watch_loop_lag
from modelswap_sidecar.agent.ports.backend import AgentBackend
from modelswap_sidecar.agent.ports.cluster_heartbeat import node_heartbeat
from modelswap_sidecar.agent.ports.desired_file import load_entries
from modelswap_sidecar.agent.ports.drain_ends import (
    drain_reloads_through_gateway,
    end_requests_on_overdue_drains,
)
from modelswap_sidecar.agent.ports.gateway_directory import AgentDirectory
from modelswap_sidecar.agent.settings.values import AgentSettings
from modelswap_sidecar.control.app import make_app
from modelswap_sidecar.control.app import start as start_control
from modelswap_sidecar.control.auth import TokenFile
from modelswap_sidecar.engine.server import harden_process
from modelswap_sidecar.gateway.app import GatewayRunner
from modelswap_sidecar.gateway.app import make_app as make_gateway_app
from modelswap_sidecar.gateway.app import start as start_gateway
from modelswap_sidecar.gateway.connections import (
    CapsError,
    ConnectionLimiter,
    control_caps,
    metrics_caps,
    open_files_limit,
)
from modelswap_sidecar.gateway.grpc_server import GrpcFront, GrpcSettings
from modelswap_sidecar.gateway.settings import GatewaySettings
from modelswap_sidecar.metrics import metrics_app

log = logging.getLogger(__name__)

ENDPOINTS_FILE = "agent.json"
#: A scraper's connection idle this long is closed (the control API's default, too).
METRICS_IDLE_TIMEOUT_SECONDS = 75.0

#: The agent's event loop: uvloop's (libuv, in C) rather than asyncio's own. The gateway's
#: every request runs through it twice (client to gateway, gateway to Triton), and on the
#: 2-core bench machine it cut the gateway's added p50 at half of saturation from 1.76/1.14
#: to 0.89/0.94 ms (two pairs side by side, `bench.gateway`).
new_event_loop = uvloop.new_event_loop


def serve(settings: AgentSettings) -> int:
    """Run the agent on its own event loop until SIGTERM or SIGINT; its exit status."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(run_agent(settings))


async def run_agent(settings: AgentSettings) -> int:
    harden_process()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with contextlib.AsyncExitStack() as stack:
            agent = await build(settings, stack)
            await run(agent, stop)
    except StartupError as e:
        return _refuse(e)
    return 0


def _refuse(error: StartupError) -> int:
    """One line on stderr (no log record: the same words twice would only confuse)."""
    sys.stderr.write(f"modelswap sidecar: {error}\n")
    return 2


async def run(agent: Agent, stop: asyncio.Event) -> None:
    """Serve until `stop` is set; then stop the loops and servers started here (the parts
    themselves are closed by the stack `agent` was built on)."""
    settings = agent.settings
    saved_file = settings.state_dir / DESIRED_FILE
    # the saved set's names are known at once; its models are taken back once Triton is ready
    agent.backend.knowledge.read_saved(load_entries(saved_file), found=saved_file.exists())
    async with contextlib.AsyncExitStack() as stack:
        # last out: the desired entries of the control API's last change reach the disk
        stack.push_async_callback(agent.backend.flush_desired)
        # Each server caps its client connections, so that a flood cannot take the fds the
        # engine, Triton's connections and the state files need (gateway.connections).
        limit = open_files_limit()
        control = await start_control(
            make_app(agent.service, TokenFile(settings.token_file)),
            on_server=ConnectionLimiter(control_caps(limit), server="control API").attach,
        )
        stack.push_async_callback(control.cleanup)
        metrics_runner = None
        if settings.metrics_port:
            metrics_runner = await _serve_metrics(agent)
            stack.push_async_callback(metrics_runner.cleanup)
        gateway_runner = None
        if settings.gateway_port:
            gateway_runner = await _serve_gateway(agent)
            stack.push_async_callback(gateway_runner.cleanup)
        grpc_front = None
        if settings.gateway_grpc_port and gateway_runner is not None:
            grpc_front = await _serve_grpc(agent, gateway_runner)
            stack.push_async_callback(grpc_front.stop)  # before the HTTP front's queues close
        tasks = [
            asyncio.create_task(agent.watch.run(), name="runtime-watch"),
            asyncio.create_task(agent.policy_loop.run(), name="policy-loop"),
            asyncio.create_task(_adopt(agent, saved_file), name="adopt"),
            asyncio.create_task(watch_loop_lag(agent.metrics.loop_lag.observe), name="loop-lag"),
        ]
        stack.push_async_callback(_cancel, tasks)
        control_port = _port_of(control)
        gateway_port = _port_of(gateway_runner) if gateway_runner else None
        write_endpoints(
            settings.state_dir / ENDPOINTS_FILE,
            {
                "pid": os.getpid(),
                "controlPort": control_port,
                "metricsPort": _port_of(metrics_runner) if metrics_runner else None,
                "gatewayPort": gateway_port,
                "gatewayGrpcPort": grpc_front.port if grpc_front else None,
                "socket": str(settings.socket_path),
            },
        )
        # What startup built (modules, settings, servers) lives as long as the process; out
        # of the collector's sight, a full collection no longer walks it (one under the
        # gateway bench's load took 92 ms, every request of that moment waiting behind it).
        gc.freeze()
        log.info(
            "agent for node %s ready: control port %d, %s allocator, %d GPU(s)",
            settings.node_name,
            control_port,
            agent.inventory.backend,
            len(agent.inventory.gpus),
        )
        tls = agent.service.settings.tls
        async with node_heartbeat(  # cluster mode only: SwapNode + node Lease
            settings,
            agent.actuator,
            agent.service,
            control_port=control_port,
            gateway_port=gateway_port,
            gateway_grpc_port=grpc_front.port if grpc_front else None,
            links=agent.probed_links,
            products=agent.products,
            certificate_pem=tls.certificate_pem if tls is not None else None,
            api=agent.api,
        ):
            await stop.wait()
        log.info("stopping the agent")


async def _adopt(agent: Agent, saved_file: Path) -> None:
    await adopt(
        agent.actuator,
        agent.driver,
        agent.watch,
        saved_entries=functools.partial(load_entries, saved_file),
        policy_of=AgentBackend.policy_of,
    )
    agent.backend.knowledge.adopted()


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _serve_metrics(agent: Agent) -> web.AppRunner:
    # aiohttp's default keep-alive (an hour) would let idle scrapers' connections pile up
    runner = web.AppRunner(
        metrics_app(agent.registry), keepalive_timeout=METRICS_IDLE_TIMEOUT_SECONDS
    )
    await runner.setup()
    assert runner.server is not None
    ConnectionLimiter(metrics_caps(open_files_limit()), server="metrics server").attach(
        runner.server
    )
    await web.TCPSite(runner, agent.settings.metrics_host, agent.settings.metrics_port).start()
    return runner


def gateway_settings(settings: AgentSettings) -> GatewaySettings:
    return GatewaySettings(
        upstream_url=f"http://{settings.triton.url}",
        host=settings.gateway_host,
        port=settings.gateway_port,
        local_mode=settings.local_mode,
        body_timeout_seconds=settings.gateway_body_timeout_seconds,
        idle_timeout_seconds=settings.gateway_idle_timeout_seconds,
        max_connections=settings.gateway_max_connections,
        max_connections_per_address=settings.gateway_max_connections_per_address,
        reserve_file_descriptors=settings.gateway_reserve_file_descriptors,
    )


async def _serve_gateway(agent: Agent) -> web.BaseRunner:
    gateway = gateway_settings(agent.settings)
    directory = AgentDirectory(agent.actuator, knowledge=agent.backend.knowledge)
    app = make_gateway_app(directory, gateway, registry=agent.registry)
    # a swap-out's drain past its timeout ends the model's requests, not the swap-out
    end_requests_on_overdue_drains(
        agent.engine,
        app,
        asyncio.get_running_loop(),
        agent.settings.policy.drain_timeout_seconds,
    )
    # and a reload drains them as a swap-out does before it unloads the model
    drain_reloads_through_gateway(
        agent.actuator,
        app,
        agent.settings.policy.drain_timeout_seconds,
        agent.engine.settings.drain_end_grace_seconds,
    )
    try:
        return await start_gateway(app)
    except CapsError as e:
        raise StartupError(str(e)) from e


def _port_of(runner: web.BaseRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    return 0


def write_endpoints(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True))
    os.replace(tmp, path)


async def _serve_grpc(agent: Agent, gateway_runner: web.BaseRunner) -> GrpcFront:
    """The gateway's gRPC front over the HTTP front's gateway (one set of queues, metrics
    and request counts), forwarding to Triton's gRPC port."""
    settings = agent.settings
    assert isinstance(gateway_runner, GatewayRunner) and settings.triton.grpc_url
    gateway = gateway_runner.app.gateway
    front = GrpcFront(
        gateway,
        GrpcSettings(
            upstream_target=settings.triton.grpc_url,
            host=settings.gateway_host,
            port=settings.gateway_grpc_port,
            max_message_bytes=gateway.settings.max_body_bytes,
        ),
    )
    try:
        await front.start()
    except (OSError, RuntimeError) as e:
        raise StartupError(f"gateway.grpcPort {settings.gateway_grpc_port}: {e}") from e
    return front
