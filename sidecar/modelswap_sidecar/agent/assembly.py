"""How the agent is put together and run: one asyncio process.

    allocator (sim | cuda-vmm | auto: `gpu_inventory`) and the GPUs it manages; in cuda-vmm
    mode each GPU's link probed once (`gpu_links`, a short-lived child per GPU)
    engine (allocator, host store, Triton stub voucher) + its protocol server (threads)
    source resolver + cache, Triton driver, metrics registry
    actuator (side effects) ← backend (NodeBackend) ← control service + aiohttp app
    (HTTPS with the serving certificate `control_tls` picks: configured, or self-signed in
    cluster mode; published in the SwapNode)
    policy loop, runtime watch, adoption of the models a previous agent held

`run_agent(settings)` returns when SIGTERM or SIGINT arrives, after closing everything it
opened. Triton itself is not started here: the supervisor (or local mode, or a test) runs
it and tells the agent its pid through the pid source. A setting that cannot work here
(cuda-vmm without a usable GPU, a kubeconfig that does not load, a configured serving
certificate that does not load) ends `run_agent` with one
line on stderr naming it and status 2, before anything is started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from modelswap_api.models import Link
from modelswap_sidecar.agent import reports
from modelswap_sidecar.agent.actuator import Actuator
from modelswap_sidecar.agent.backend import AgentBackend
from modelswap_sidecar.agent.cluster_heartbeat import node_heartbeat
from modelswap_sidecar.agent.control_tls import control_certificate
from modelswap_sidecar.agent.desired_file import load_entries
from modelswap_sidecar.agent.errors import StartupError
from modelswap_sidecar.agent.gateway_directory import AgentDirectory
from modelswap_sidecar.agent.gpu_inventory import GpuInventory, build_allocator
from modelswap_sidecar.agent.gpu_links import Prober, measure_links
from modelswap_sidecar.agent.kube_access import api_client
from modelswap_sidecar.agent.loading import ModelLoader
from modelswap_sidecar.agent.loops import PolicyLoop, RuntimeWatch
from modelswap_sidecar.agent.records import AgentModel, Serving
from modelswap_sidecar.agent.settings import AgentSettings
from modelswap_sidecar.allocators.base import Allocator
from modelswap_sidecar.control.app import make_app
from modelswap_sidecar.control.app import start as start_control
from modelswap_sidecar.control.auth import TokenFile
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings
from modelswap_sidecar.engine.core import Engine, EngineSettings
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.server import EngineServer, harden_process
from modelswap_sidecar.gateway.app import make_app as make_gateway_app
from modelswap_sidecar.gateway.app import start as start_gateway
from modelswap_sidecar.gateway.settings import GatewaySettings
from modelswap_sidecar.metrics import NodeMetrics, metrics_app, register_link_metrics
from modelswap_sidecar.policy.facade import Policy
from modelswap_sidecar.policy.inputs import PolicySettings
from modelswap_sidecar.sources.cache import CacheSettings, SourceCache
from modelswap_sidecar.sources.resolver import SourceResolver
from modelswap_sidecar.triton.driver import TritonDriver
from modelswap_sidecar.triton.errors import TritonError
from modelswap_sidecar.triton.pids import TritonPidSource
from modelswap_sidecar.triton.repository import ModelRepository
from modelswap_sidecar.triton.stubs import TritonVoucher

log = logging.getLogger(__name__)

DESIRED_FILE = "desired.json"
REVISION_FILE = "revision.json"
ENDPOINTS_FILE = "agent.json"


@dataclass
class Agent:
    settings: AgentSettings
    engine: Engine
    allocator: Allocator
    inventory: GpuInventory
    links: tuple[Link, ...]
    server: EngineServer
    driver: TritonDriver
    cache: SourceCache
    actuator: Actuator
    backend: AgentBackend
    service: ControlService
    registry: CollectorRegistry
    policy_loop: PolicyLoop
    watch: RuntimeWatch


def build_engine(
    settings: AgentSettings, voucher: TritonVoucher, allocator: Allocator, inventory: GpuInventory
) -> Engine:
    store = HostStore(
        settings.host_store_dir,
        dict.fromkeys(range(len(inventory.gpus)), settings.host_store_capacity_bytes),
    )
    engine_settings = EngineSettings(
        drain_timeout_seconds=settings.policy.drain_timeout_seconds,
        reserve_bytes=inventory.reserve_bytes,
        overhead_bytes_per_process=settings.overhead_bytes_per_process,
    )
    engine = Engine(allocator, store, voucher, engine_settings)
    engine.recover()  # a previous agent's models; their clients readopt within the grace
    return engine


@contextlib.asynccontextmanager
async def assembled(
    settings: AgentSettings,
    *,
    choose: Callable[[str], str] | None = None,
    cuda_options: dict[str, object] | None = None,
    prober: Prober | None = None,
) -> AsyncIterator[Agent]:
    """Every part built and started; all of it closed on exit (the serving certificate
    first: a configured one that cannot be used raises `StartupError`). `choose` (the `auto`
    decision), `cuda_options` (to `CudaVmmAllocator`) and `prober` (the link probe) are
    for tests. Raises `StartupError` naming the setting when the allocator cannot start."""
    certificate = control_certificate(settings)  # a bad configured one ends here, named
    allocator, inventory = build_allocator(settings, choose=choose, cuda_options=cuda_options)
    try:
        links = await measure_links(settings, inventory, prober=prober)
    except BaseException:
        allocator.close()
        raise
    log.info(
        "allocator %s (setting %s): %d GPU(s) %s",
        inventory.backend,
        settings.allocator,
        len(inventory.gpus),
        ", ".join(inventory.uuids),
    )
    for folder in (settings.socket_dir, settings.state_dir):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings.socket_dir.chmod(0o755)  # stubs (another uid) reach the socket through it
    pid_source = TritonPidSource(
        pid_file=settings.triton.pid_file,
        supervisor_state_file=settings.triton.supervisor_state_file,
    )
    try:
        engine = build_engine(settings, TritonVoucher(pid_source), allocator, inventory)
    except BaseException:
        allocator.close()
        raise
    server = EngineServer(engine, settings.socket_path)
    server.start()
    repository = ModelRepository(settings.triton.repository)
    repository.create()
    driver = TritonDriver(
        settings.triton.url,
        repository,
        request_timeout_seconds=settings.triton.request_timeout_seconds,
        load_timeout_seconds=settings.triton.load_timeout_seconds,
    )
    cache = SourceCache(
        CacheSettings(
            root=settings.source_cache_dir,
            capacity_bytes=settings.source_cache_capacity_bytes,
            max_download_bytes=settings.source_max_download_bytes,
            trust_env=settings.source_trust_env,
        )
    )
    loader = ModelLoader(
        engine=engine,
        driver=driver,
        resolver=SourceResolver(cache),
        socket_path=settings.socket_path,
        model_roots=settings.model_roots,
        mapper=inventory.mapper,
        gpu_uuids=inventory.uuids if inventory.backend != "sim" else (),
    )
    registry = CollectorRegistry()
    holder: dict[str, Actuator] = {}
    metrics = NodeMetrics(
        registry,
        lambda: reports.node_sample(
            engine, list(holder["actuator"].records.values()), inventory.uuids
        ),
    )
    register_link_metrics(registry, inventory.uuids, links)
    policy = Policy(
        PolicySettings(
            high_watermark_fraction=settings.policy.high_watermark_fraction,
            low_watermark_fraction=settings.policy.low_watermark_fraction,
        ),
        time.monotonic,
    )
    actuator = Actuator(
        engine=engine,
        loader=loader,
        policy=policy,
        gpu_uuids=inventory.uuids,
        metrics=metrics,
        links=links,
    )
    actuator.listen(asyncio.get_running_loop())
    actuator.set_retry_seconds(settings.policy.retry_failed_seconds)
    holder["actuator"] = actuator
    backend = AgentBackend(
        actuator,
        node_name=settings.node_name,
        agent_version=settings.agent_version,
        desired_file=settings.state_dir / DESIRED_FILE,
        gpu_products=tuple(g.product for g in inventory.gpus)
        if inventory.backend != "sim"
        else None,
        gpu_links=links if inventory.backend != "sim" else None,
    )
    service = ControlService(
        backend,
        ControlSettings(
            node_name=settings.node_name,
            token_file=settings.token_file,
            state_file=settings.state_dir / REVISION_FILE,
            host=settings.control_host,
            port=settings.control_port,
            grace_seconds=settings.grace_seconds,
            fencing_enabled=not settings.local_mode,
            tls=certificate,
        ),
        clock=time.monotonic,
    )
    actuator.may_load_new = service.may_load_new
    interval = settings.policy.interval_seconds
    agent = Agent(
        settings=settings,
        engine=engine,
        allocator=allocator,
        inventory=inventory,
        links=links,
        server=server,
        driver=driver,
        cache=cache,
        actuator=actuator,
        backend=backend,
        service=service,
        registry=registry,
        policy_loop=PolicyLoop(actuator, driver, interval_seconds=interval, metrics=metrics),
        watch=RuntimeWatch(
            actuator, driver, pid_source, interval_seconds=interval, metrics=metrics
        ),
    )
    try:
        yield agent
    finally:
        await actuator.close()
        await driver.close()
        await cache.close()
        server.close()
        engine.close()
        allocator.close()


async def adopt(agent: Agent) -> int:
    """Take back the models a previous agent held (from its desired file), once Triton is
    ready. A model Triton still serves is held as loading until its clients have readopted
    their memory (the engine then counts live instances; no swap may touch it before),
    then as loaded; any other is loaded again by the policy loop (restored from the host
    store when the engine kept a copy)."""
    await agent.watch.first_ready.wait()
    try:
        index = await agent.driver.repository_index()
    except TritonError as e:
        log.warning("cannot read Triton's repository index to adopt models: %s", e)
        index = {}
    adopted: list[AgentModel] = []
    for entry in load_entries(agent.settings.state_dir / DESIRED_FILE):
        if entry.uid in agent.actuator.records:
            continue  # the operator pushed it first
        try:  # a saved entry this agent cannot hold (an older agent took it) stays out
            policy = agent.backend.policy_of(entry)
            model = AgentModel(entry=entry, policy=policy)
        except Exception as e:
            log.warning("not adopting %s: %s", entry.uid, e)
            continue
        try:
            model.gpu = agent.engine.model(model.triton_name).config.gpu
        except UnknownModel:
            model.gpu = None
        served = index.get(model.triton_name)
        if served is not None and served.state == "READY" and model.gpu is not None:
            model.serving = Serving.LOADING
            model.reason, model.message = "Adopting", "waiting for its clients to readopt"
            adopted.append(model)
        agent.actuator.records[entry.uid] = model
    if adopted:
        log.info("adopting %d model(s) held before this agent started", len(adopted))
    deadline = time.monotonic() + agent.engine.settings.readopt_grace_seconds + 5.0
    waiting = list(adopted)
    while waiting:
        for model in list(waiting):
            status = reports.status_of(agent.engine, model)
            if status is not None and status.instances > 0:
                model.serving = Serving.LOADED
                model.resident_since_seconds = time.monotonic()
                model.reason, model.message = "Adopted", ""
                waiting.remove(model)
                agent.actuator.notify()
        if not waiting or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    for model in waiting:  # no client came back: load it again (restored from the store)
        log.warning("model %s: no client readopted it; loading it again", model.uid)
        model.serving = Serving.PENDING
    agent.actuator.notify()
    return len(adopted) - len(waiting)


async def _serve_metrics(settings: AgentSettings, registry: CollectorRegistry) -> web.AppRunner:
    runner = web.AppRunner(metrics_app(registry))
    await runner.setup()
    await web.TCPSite(runner, settings.metrics_host, settings.metrics_port).start()
    return runner


def _port_of(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    return 0


def write_endpoints(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True))
    os.replace(tmp, path)


async def _serve_gateway(settings: AgentSettings, agent: Agent) -> web.AppRunner:
    gateway = GatewaySettings(
        upstream_url=f"http://{settings.triton.url}",
        host=settings.gateway_host,
        port=settings.gateway_port,
        local_mode=settings.local_mode,
    )
    app = make_gateway_app(AgentDirectory(agent.actuator), gateway, registry=agent.registry)
    return await start_gateway(app)


async def run_agent(settings: AgentSettings) -> int:
    harden_process()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        api = api_client(settings)  # cluster mode: a bad kubeconfig ends here, named
    except StartupError as e:
        return _refuse(e)
    try:
        return await _run(settings, stop, api)
    except StartupError as e:
        return _refuse(e)
    finally:
        if api is not None:
            await asyncio.to_thread(api.close)


def _refuse(error: StartupError) -> int:
    """One line on stderr (no log record: the same words twice would only confuse)."""
    sys.stderr.write(f"modelswap sidecar: {error}\n")
    return 2


async def _run(settings: AgentSettings, stop: asyncio.Event, api: Any) -> int:
    async with assembled(settings) as agent:
        control = await start_control(make_app(agent.service, TokenFile(settings.token_file)))
        metrics_runner = None
        if settings.metrics_port:
            metrics_runner = await _serve_metrics(settings, agent.registry)
        gateway_runner = None
        if settings.gateway_port:
            gateway_runner = await _serve_gateway(settings, agent)
        tasks = [
            asyncio.create_task(agent.watch.run(), name="runtime-watch"),
            asyncio.create_task(agent.policy_loop.run(), name="policy-loop"),
            asyncio.create_task(adopt(agent), name="adopt"),
        ]
        write_endpoints(
            settings.state_dir / ENDPOINTS_FILE,
            {
                "pid": os.getpid(),
                "controlPort": _port_of(control),
                "metricsPort": _port_of(metrics_runner) if metrics_runner else None,
                "gatewayPort": _port_of(gateway_runner) if gateway_runner else None,
                "socket": str(settings.socket_path),
            },
        )
        log.info(
            "agent for node %s ready: control port %d, %s allocator, %d GPU(s)",
            settings.node_name,
            _port_of(control),
            agent.inventory.backend,
            len(agent.inventory.gpus),
        )
        tls = agent.service.settings.tls
        async with node_heartbeat(  # cluster mode only: SwapNode + node Lease
            settings,
            agent.actuator,
            agent.service,
            control_port=_port_of(control),
            gateway_port=_port_of(gateway_runner) if gateway_runner else None,
            links=agent.links if agent.inventory.backend != "sim" else None,
            products=(
                tuple(g.product for g in agent.inventory.gpus)
                if agent.inventory.backend != "sim"
                else None
            ),
            certificate_pem=tls.certificate_pem if tls is not None else None,
            api=api,
        ):
            await stop.wait()
        log.info("stopping the agent")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await control.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        if gateway_runner is not None:
            await gateway_runner.cleanup()
    return 0
