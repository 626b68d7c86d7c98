"""Building the agent: every part constructed once, in dependency order, each closed by the
exit stack it is built on (`build(settings, stack) -> Agent`); `running.run` starts it.

    Kubernetes API client (cluster mode) and the control API's serving certificate
      (`ports.kube_access`, `ports.control_tls`): a setting that cannot work ends here
    allocator and GPU inventory (`gpu_setup`: sim | cuda-vmm | auto), each GPU's link
    engine (allocator, host store, Triton stub voucher; local mode's dev loop adds the dev
      voucher; the decider of clients' own swap-ins, which calls the actuator built below)
    Triton driver, source cache and resolver → model loader
    records table → metrics (sampled from it) → actuator (engine, loader, policy, records)
      → the engine's protocol server (threads), once the decider's actuator exists
    backend (actuator) → control service (backend)
    policy loop (actuator, driver, the service's fencing) and runtime watch (Triton's pid)

Nothing is started but the engine's protocol server (clients of a previous agent readopt
through it) and the actuator's subscription to the engine's swap events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from modelswap_api.models import Link
from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.loading import ModelLoader
from modelswap_sidecar.agent.core.loops import PolicyLoop, RuntimeWatch
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.core.unresponsive import UnresponsiveRuntimes
from modelswap_sidecar.agent.errors import StartupError
from modelswap_sidecar.agent.gpu_setup import build_allocator, measure_links
from modelswap_sidecar.agent.ports import reports
from modelswap_sidecar.agent.ports.backend import AgentBackend
from modelswap_sidecar.agent.ports.control_tls import control_certificate
from modelswap_sidecar.agent.ports.kube_access import api_client
from modelswap_sidecar.agent.settings.values import AgentSettings, PolicyLoopSettings
from modelswap_sidecar.allocators.base import Allocator
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings
from modelswap_sidecar.engine.core import Engine, EngineSettings, SwapInDecider
from modelswap_sidecar.engine.hoststore import MEMORY_FILESYSTEMS, HostStore, filesystem_of
from modelswap_sidecar.engine.server import EngineServer
from modelswap_sidecar.engine.vouching import AnyVoucher, DevModels, DevVoucher, Voucher
from modelswap_sidecar.gpu.inventory import GpuInventory
from modelswap_sidecar.gpu.links import Prober
from modelswap_sidecar.metrics import NodeMetrics, register_link_metrics
from modelswap_sidecar.policy.facade import Policy
from modelswap_sidecar.policy.inputs import PolicySettings
from modelswap_sidecar.sources.cache import CacheSettings, SourceCache
from modelswap_sidecar.sources.resolver import SourceResolver
from modelswap_sidecar.triton.driver import TritonDriver
from modelswap_sidecar.triton.pids import TritonPidSource
from modelswap_sidecar.triton.repository import ModelRepository
from modelswap_sidecar.triton.stubs import TritonVoucher, is_descendant

log = logging.getLogger(__name__)

DESIRED_FILE = "desired.json"
REVISION_FILE = "revision.json"


@dataclass(frozen=True, kw_only=True)
class Agent:
    settings: AgentSettings
    #: The Kubernetes API client (cluster mode), else None.
    api: Any
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
    metrics: NodeMetrics
    policy_loop: PolicyLoop
    watch: RuntimeWatch

    @property
    def sim(self) -> bool:
        return self.inventory.backend == "sim"

    @property
    def products(self) -> tuple[str, ...] | None:
        """Each GPU's product name (cuda-vmm); None on sim GPUs."""
        return None if self.sim else tuple(g.product for g in self.inventory.gpus)

    @property
    def probed_links(self) -> tuple[Link, ...] | None:
        """Each GPU's probed link (cuda-vmm); None on sim GPUs."""
        return None if self.sim else self.links


def sim_paces(settings: AgentSettings, inventory: GpuInventory) -> dict[int, float]:
    """Per GPU ordinal, the `gpus[].paceGBps` its models pace their copies to (bytes/s):
    sim GPUs only (auto that chose cuda-vmm ignores the sim entries, paces included)."""
    if inventory.backend != "sim":
        return {}
    return {i: g.pace_gbps * 1e9 for i, g in enumerate(settings.gpus) if g.pace_gbps}


def voucher_of(pid_source: Callable[[], int | None], dev_models: DevModels | None) -> Voucher:
    """Triton's stubs; with local mode's dev loop also a process of the agent's uid outside
    Triton for a dev model (`engine.vouching.DevVoucher`)."""
    triton = TritonVoucher(pid_source)
    if dev_models is None:
        return triton

    def in_triton(pid: int) -> bool:
        triton_pid = pid_source()
        return triton_pid is not None and (pid == triton_pid or is_descendant(pid, triton_pid))

    dev = DevVoucher(dev_models.names, uid=os.geteuid(), excluded=in_triton)
    return AnyVoucher([triton, dev])


def check_host_store(settings: AgentSettings, backend: str, mountinfo: str | None = None) -> None:
    """On a GPU backend the host store must be memory-backed: clients pin its files for
    their copies (cuMemHostRegister), which a disk filesystem's pages refuse, so every
    commit would fail. Raises `StartupError` naming `hostStore.dir`."""
    if backend == "sim":
        return
    kind = filesystem_of(settings.host_store_dir, mountinfo)
    if kind and kind not in MEMORY_FILESYSTEMS:
        raise StartupError(
            f"hostStore.dir {settings.host_store_dir} is on a {kind} filesystem: with the "
            f"{backend} allocator it must be memory-backed (tmpfs, e.g. /dev/shm or an "
            "emptyDir with medium: Memory), because CUDA cannot pin a disk file's pages "
            "for the model processes' copies"
        )


def build_engine(
    settings: AgentSettings,
    voucher: Voucher,
    allocator: Allocator,
    inventory: GpuInventory,
    decider: SwapInDecider,
) -> Engine:
    check_host_store(settings, inventory.backend)
    store = HostStore(
        settings.host_store_dir,
        dict.fromkeys(range(len(inventory.gpus)), settings.host_store_capacity_bytes),
    )
    engine_settings = EngineSettings(
        drain_timeout_seconds=settings.policy.drain_timeout_seconds,
        unresponsive_after_seconds=settings.policy.unresponsive_after_seconds,
        reserve_bytes=inventory.reserve_bytes,
        overhead_bytes_per_process=settings.overhead_bytes_per_process,
        pace_bytes_per_second=sim_paces(settings, inventory),
    )
    engine = Engine(allocator, store, voucher, engine_settings, decider=decider)
    engine.recover()  # a previous agent's models; their clients readopt within the grace
    return engine


async def build(
    settings: AgentSettings,
    stack: contextlib.AsyncExitStack,
    *,
    choose: Callable[[str], str] | None = None,
    cuda_options: dict[str, object] | None = None,
    prober: Prober | None = None,
) -> Agent:
    """Every part of the agent, each closed by `stack` (in reverse order of building).
    `choose` (the `auto` decision), `cuda_options` (to `CudaVmmAllocator`) and `prober`
    (the link probe) are for tests. Raises `StartupError` naming the setting that cannot
    work (a kubeconfig, a serving certificate, the allocator), before anything starts."""
    api = api_client(settings)  # cluster mode: a bad kubeconfig ends here, named
    if api is not None:
        stack.push_async_callback(asyncio.to_thread, api.close)
    certificate = control_certificate(settings)  # a bad configured one ends here, named
    allocator, inventory = build_allocator(settings, choose=choose, cuda_options=cuda_options)
    stack.callback(allocator.close)
    links = await measure_links(settings, inventory, prober=prober)
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
    dev_models = DevModels(settings.dev_models_file) if settings.dev_models_file else None

    def decide_client_swap_in(name: str) -> None:
        # the actuator is built below, with the engine; the protocol server, the only way
        # a client's request reaches the engine, starts once both exist
        actuator.decide_client_swap_in(name)

    engine = build_engine(
        settings, voucher_of(pid_source, dev_models), allocator, inventory, decide_client_swap_in
    )
    stack.callback(engine.close)
    repository = ModelRepository(settings.triton.repository)
    repository.create()
    driver = TritonDriver(
        settings.triton.url,
        repository,
        request_timeout_seconds=settings.triton.request_timeout_seconds,
        load_timeout_seconds=settings.triton.load_timeout_seconds,
    )
    stack.push_async_callback(driver.close)
    cache = SourceCache(
        CacheSettings(
            root=settings.source_cache_dir,
            capacity_bytes=settings.source_cache_capacity_bytes,
            max_download_bytes=settings.source_max_download_bytes,
            trust_env=settings.source_trust_env,
        )
    )
    stack.push_async_callback(cache.close)
    loader = ModelLoader(
        engine=engine,
        driver=driver,
        resolver=SourceResolver(cache),
        socket_path=settings.socket_path,
        model_roots=settings.model_roots,
        mapper=inventory.mapper,
        gpu_uuids=inventory.uuids if inventory.backend != "sim" else (),
        dev_models=dev_models.names if dev_models is not None else None,
    )
    registry = CollectorRegistry()
    records: dict[str, AgentModel] = {}
    metrics = NodeMetrics(
        registry, lambda: reports.node_sample(engine, list(records.values()), inventory.uuids)
    )
    register_link_metrics(registry, inventory.uuids, links)
    policy = Policy(policy_settings(settings.policy), time.monotonic)
    actuator = Actuator(
        engine=engine,
        loader=loader,
        policy=policy,
        gpu_uuids=inventory.uuids,
        metrics=metrics,
        records=records,
        links=links,
        retry_failed_seconds=settings.policy.retry_failed_seconds,
        reload_timeout_seconds=settings.triton.load_timeout_seconds,
        adopting=True,  # `running` adopts the previous agent's models
    )
    actuator.listen(asyncio.get_running_loop())
    server = EngineServer(engine, settings.socket_path)
    server.start()
    stack.callback(server.close)
    UnresponsiveRuntimes(actuator, TritonVoucher(pid_source).kill).listen()
    stack.push_async_callback(actuator.close)
    sim = inventory.backend == "sim"
    backend = AgentBackend(
        actuator,
        node_name=settings.node_name,
        agent_version=settings.agent_version,
        desired_file=settings.state_dir / DESIRED_FILE,
        gpu_products=None if sim else tuple(g.product for g in inventory.gpus),
        gpu_links=None if sim else links,
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
            body_timeout_seconds=settings.control_body_timeout_seconds,
            idle_timeout_seconds=settings.control_idle_timeout_seconds,
        ),
        clock=time.monotonic,
    )
    interval = settings.policy.interval_seconds
    return Agent(
        settings=settings,
        api=api,
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
        metrics=metrics,
        policy_loop=PolicyLoop(
            actuator,
            driver,
            interval_seconds=interval,
            metrics=metrics,
            may_load_new=service.may_load_new,
        ),
        watch=RuntimeWatch(
            actuator, driver, pid_source, interval_seconds=interval, metrics=metrics
        ),
    )


def policy_settings(loop: PolicyLoopSettings) -> PolicySettings:
    """The policy's settings from the agent's `policy` section."""
    return PolicySettings(
        high_watermark_fraction=loop.high_watermark_fraction,
        low_watermark_fraction=loop.low_watermark_fraction,
        busy_victim_wait_seconds=loop.busy_victim_wait_seconds,
    )
