"""The operator assembled: every collaborator built once here and passed down (the
composition root), and the order things start and stop in.

Start: the HTTP server (/healthz answers on a standby replica too), then the leader Lease
(blocks until this replica leads: kopf's watches start only after), the Lease holder
(renewing from then on), the control token, then the planner loop. A replica that loses
the Lease stops the loop at once (no push or status write after that) and calls
`on_lost`, which makes `modelswap operator` exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from modelswap_api import kube
from modelswap_operator.agents import AgentClients
from modelswap_operator.cache import Cache
from modelswap_operator.events import EventRecorder
from modelswap_operator.health import health_app
from modelswap_operator.kubeio import KubeIO
from modelswap_operator.leadership import LeaderElector, LeadershipLost, unique_identity
from modelswap_operator.metrics import OperatorMetrics
from modelswap_operator.reconciler import Reconciler
from modelswap_operator.settings import OperatorSettings
from modelswap_operator.tokens import TokenSource

log = logging.getLogger(__name__)


class Runtime:
    def __init__(
        self,
        settings: OperatorSettings,
        *,
        api: Any | None = None,
        registry: CollectorRegistry | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.on_lost = on_lost
        self.api = (
            api
            if api is not None
            else kube.api_client(str(settings.kubeconfig) if settings.kubeconfig else None)
        )
        self.metrics = OperatorMetrics(registry if registry is not None else CollectorRegistry())
        self.io = KubeIO(self.api, threads=settings.kube_threads, metrics=self.metrics)
        self.cache = Cache()
        self.agents = AgentClients(
            timeout_seconds=settings.push_timeout_seconds,
            allow_plain_http=settings.allow_plain_http,
        )
        self.tokens = TokenSource(self.io, settings.namespace, settings.token_secret)
        self.identity = unique_identity(settings.identity)
        self.elector = LeaderElector(
            self.api,
            settings.namespace,
            settings.leader_lease,
            self.identity,
            lease_duration_seconds=int(settings.leader_lease_seconds),
            renew_interval_seconds=settings.leader_renew_seconds,
        )
        self.reconciler = Reconciler(
            settings,
            self.cache,
            io=self.io,
            agents=self.agents,
            events=EventRecorder(self.io),
            metrics=self.metrics,
            term=lambda: self.elector.term or 0,
            tokens=self.tokens,
            confirm_leading=self.elector.confirm,
        )
        self.lost = False
        self._leading = False
        self._loop: asyncio.Task[None] | None = None
        self._holder: asyncio.Task[None] | None = None
        self._http: web.AppRunner | None = None

    async def wait_released(self, uid: str, timeout_seconds: float) -> bool:
        return await self.reconciler.wait_released(uid, timeout_seconds)

    def namespace_terminating(self, namespace: str) -> bool:
        """The namespace is being deleted (it refused an Event as terminating)."""
        return self.reconciler.events.terminating(namespace)

    def alive(self) -> bool:
        return not self.lost and (self._loop is None or not self._loop.done())

    def ready(self) -> bool:
        return self._leading and self.reconciler.ready

    async def start(self) -> None:
        await self._serve_http()
        log.info("%s: waiting for the leader Lease %s/%s", self.identity,
                 self.settings.namespace, self.settings.leader_lease)  # fmt: skip
        term = await self.elector.acquire()
        self._leading = True
        self.metrics.leader.set(1)
        log.info("%s leads (term %d)", self.identity, term)
        # Renewals start at once: the rest of the start (the token's first read, on a busy
        # machine seconds) must not outlast the Lease, or a standby takes over meanwhile.
        self._holder = asyncio.create_task(self._hold(), name="leader-lease")
        try:
            await self.tokens.ensure()
        except BaseException:
            self._holder.cancel()
            raise
        if self.lost:
            return  # lost while starting: on_lost has been called, nothing to run
        self._loop = asyncio.create_task(self._run_loop(), name="planner-loop")

    async def _run_loop(self) -> None:
        try:
            await self.reconciler.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the planner loop died")
            raise

    async def _hold(self) -> None:
        try:
            await self.elector.hold()
        except LeadershipLost as e:
            log.error("%s: leadership lost: %s", self.identity, e)
        self._leading = False
        self.lost = True
        self.metrics.leader.set(0)
        if self._loop is not None:
            self._loop.cancel()
        if self.on_lost is not None:
            self.on_lost()

    async def _serve_http(self) -> None:
        if self.settings.http_port == 0 or self._http is not None:
            return
        app = health_app(self.metrics.registry, alive=self.alive, ready=self.ready)
        self._http = web.AppRunner(app, access_log=None)
        await self._http.setup()
        site = web.TCPSite(self._http, self.settings.http_host, self.settings.http_port)
        await site.start()

    async def stop(self) -> None:
        for task in (self._holder, self._loop):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._leading:
            with contextlib.suppress(Exception):
                await self.elector.release()
            self._leading = False
            self.metrics.leader.set(0)
        await self.agents.aclose()
        if self._http is not None:
            await self._http.cleanup()
            self._http = None
        self.io.close()
