"""Fake node agents for `bench.operator_scale`, all in this one process.

`python -m bench.fake_nodes --kubeconfig K --token-file T --nodes 100 --stats S`

Each fake serves the real control API app (`modelswap_sidecar.control.app.make_app` over
`ControlService`) on its own loopback port, plain HTTP, with `InMemoryBackend` behind it
(models change state at once, no bytes move), and runs the agent's real heartbeat
(`modelswap_sidecar.heartbeat.Heartbeat`): it creates its SwapNode, renews its node Lease
and writes the SwapNode status from a report of the backend's GPUs and models, so the
operator sees each model Resident as soon as its node took it. Prints `ready` once every
fake serves; writes its API-write counters to S every second; exits on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

from modelswap_api import kube
from modelswap_api.control import DesiredEntry, EntryResult
from modelswap_api.models import GpuStatus, HostedModel, Link
from modelswap_sidecar.control.app import make_app
from modelswap_sidecar.control.auth import TokenFile
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings
from modelswap_sidecar.heartbeat.cluster import KubeNodeCluster
from modelswap_sidecar.heartbeat.heartbeat import Heartbeat
from modelswap_sidecar.heartbeat.report import NodeReport
from modelswap_sidecar.heartbeat.settings import HeartbeatSettings
from tests.support.memory_backend import InMemoryBackend

GIB = 1 << 30
GPUS_PER_NODE = 8
HBM_BYTES = 80 * GIB
HOST_STORE_BYTES = 400 * GIB
LEASE_NAMESPACE = "modelswap-node-leases"
#: The planner packs a GPU past its HBM (swapped-out models need only host store); a real
#: agent takes every entry and swaps others out to make room, while InMemoryBackend
#: defers what does not fit at once. So the backend books each GPU at this many times its
#: HBM and the report states the real HBM (free bytes floored at 0).
BOOKED_HBM_FACTOR = 64


class NotifyingBackend(InMemoryBackend):
    """InMemoryBackend that says when a push changed what it holds (report it soon)."""

    def __init__(self, node_name: str, budgets: dict[str, int]) -> None:
        super().__init__(node_name, budgets, agent_version="bench-fake")
        self.changed = asyncio.Event()

    async def converge(self, entries: Sequence[DesiredEntry]) -> Sequence[EntryResult]:
        results = await super().converge(entries)
        self.changed.set()
        return results

    async def unload(self, uid: str) -> None:
        await super().unload(uid)
        self.changed.set()


class FakeNode:
    def __init__(self, name: str, token_file: Path, state_dir: Path, api: object) -> None:
        self.name = name
        gpus = {f"{name}-gpu-{i}": HBM_BYTES * BOOKED_HBM_FACTOR for i in range(GPUS_PER_NODE)}
        self.backend = NotifyingBackend(name, gpus)
        settings = ControlSettings(
            node_name=name,
            token_file=token_file,
            state_file=state_dir / f"{name}.json",
            host="127.0.0.1",
            port=0,
            grace_seconds=30.0,
            fencing_enabled=False,  # no swaps happen here: nothing to fence
        )
        self.service = ControlService(self.backend, settings, clock=time.monotonic)
        self.app = make_app(self.service, TokenFile(token_file))
        self.runner = web.AppRunner(self.app, access_log=None)
        self.endpoint = ""
        self.report = NodeReport(agent_version="bench-fake")
        self.heartbeat = Heartbeat(
            HeartbeatSettings(
                node_name=name,
                lease_namespace=LEASE_NAMESPACE,
                lease_duration_seconds=20,
                renew_interval_seconds=5.0,
                status_interval_seconds=10.0,
                min_status_write_interval_seconds=1.0,
                node_refresh_seconds=600.0,
            ),
            KubeNodeCluster(api),
            lambda: self.report,
        )

    async def start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.endpoint = f"http://127.0.0.1:{port}"
        await self.refresh()
        await self.heartbeat.start()

    async def refresh(self) -> None:
        """The report from what the backend holds (what a real agent's NodeReporter does)."""
        info = await self.backend.node_info()
        used = {g.uuid: (g.hbm_total_bytes or 0) - (g.hbm_free_bytes or 0) for g in info.gpus}
        gpus = tuple(
            GpuStatus(
                uuid=g.uuid,
                ordinal=g.ordinal,
                hbm_total_bytes=HBM_BYTES,
                hbm_free_bytes=max(0, HBM_BYTES - used[g.uuid]),
                host_store_bytes=g.host_store_bytes,
                host_store_capacity_bytes=HOST_STORE_BYTES,
                link=Link(kind="sim", host_to_device_gbps=55.0, device_to_host_gbps=57.0),
            )
            for g in info.gpus
        )
        models = tuple(
            HostedModel(
                uid=m.uid,
                namespace=m.namespace,
                name=m.name,
                state=m.phase,
                gpu=m.gpu,
                resident_bytes=m.resident_bytes,
                generation=m.generation,
                desired=True,
                host_bytes=m.host_bytes,
                swap_ins=m.swap_ins,
                swap_outs=m.swap_outs,
                reason="Loaded",
            )
            for m in await self.backend.models()
        )
        self.report = NodeReport(
            agent_version="bench-fake",
            endpoint=self.endpoint,
            gateway_endpoint=f"http://127.0.0.1:1/{self.name}",
            gpus=gpus,
            models=models,
        )

    async def follow(self) -> None:
        """Report again after every push that changed something."""
        while True:
            await self.backend.changed.wait()
            self.backend.changed.clear()
            await self.refresh()
            self.heartbeat.status_changed()

    async def stop(self) -> None:
        await self.heartbeat.stop()
        await self.runner.cleanup()


async def serve(args: argparse.Namespace) -> None:
    api = kube.api_client(str(args.kubeconfig))
    state_dir = Path(args.state_dir)  # made by main()
    nodes = [
        FakeNode(f"node-{i:03d}", Path(args.token_file), state_dir, api) for i in range(args.nodes)
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # the heartbeats' blocking kube calls run in threads: enough for 100 nodes' renewals
    loop.set_default_executor(ThreadPoolExecutor(32))
    for node in nodes:
        await node.start()
    followers = [asyncio.create_task(n.follow()) for n in nodes]
    print("ready", flush=True)
    while not stop.is_set():
        stats = {
            "status_writes": sum(n.heartbeat.status_writes for n in nodes),
            "lease_renewals": sum(n.heartbeat.lease_renewals for n in nodes),
            "models": sum(len(n.report.models) for n in nodes),
        }
        await asyncio.to_thread(Path(args.stats).write_text, json.dumps(stats))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    for t in followers:
        t.cancel()
    for node in nodes:
        await node.stop()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--stats", required=True)
    args = p.parse_args()
    Path(args.state_dir).mkdir(parents=True, exist_ok=True)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
