"""The node heartbeat: the agent's SwapNode (status on change only) and its node Lease.

    heartbeat = Heartbeat(settings, KubeNodeCluster(kube.api_client()), report_provider,
                          on_renewed=control.record_lease_renewal)
    async with heartbeat:            # two tasks on the agent's loop
        ...
        heartbeat.status_changed()   # something reported changed: compare and write soon

- **SwapNode.** Created once (named after the Node, owned by it through an
  ownerReference); its status is `objects.desired_status(report, node)` and is written
  only when it differs from what this heartbeat last wrote (or, at start, from what the
  object holds), at most once per `min_status_write_interval_seconds`. The Node's labels
  and taints, and the SwapNode itself, are read again every `node_refresh_seconds`: a
  SwapNode deleted or edited behind the agent's back is created or written again.
- **Lease.** `<lease_namespace>/<node name>` is renewed every `renew_interval_seconds`
  (PUT with the resourceVersion last seen; a conflict re-reads and retries once). Stopping
  the heartbeat stops the renewals and leaves the Lease to go stale: the operator then
  treats the node as lost. `renewals_failing`, `consecutive_renewal_failures` and
  `last_renewal_monotonic_seconds` feed the agent's fencing rule; `on_renewed` is called
  after every successful renewal.

Failures are logged (a warning when a kind of call starts failing and when it recovers,
debug in between) and retried at the next interval; nothing here raises into the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from modelswap_api.kube import Conflict, KubeError, NotFound
from modelswap_sidecar.heartbeat.cluster import NodeCluster
from modelswap_sidecar.heartbeat.objects import (
    NodeFacts,
    desired_status,
    new_lease,
    owned_by,
    owner_patch,
    renewed_lease,
    swapnode_body,
)
from modelswap_sidecar.heartbeat.report import ReportProvider
from modelswap_sidecar.heartbeat.settings import HeartbeatSettings

log = logging.getLogger(__name__)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Heartbeat:
    def __init__(
        self,
        settings: HeartbeatSettings,
        cluster: NodeCluster,
        report: ReportProvider,
        *,
        on_renewed: Callable[[], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._settings = settings
        self._cluster = cluster
        self._report = report
        self._on_renewed = on_renewed
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self._tasks: list[asyncio.Task[None]] = []
        self._nudge = asyncio.Event()
        self._node: NodeFacts | None = None
        self._node_read_at: float | None = None
        self._swapnode_ready = False
        self._last_sent: dict[str, Any] | None = None
        self._last_write_at: float | None = None
        self._lease: dict[str, Any] | None = None
        self._failing: set[str] = set()
        self.status_writes = 0
        self.lease_renewals = 0
        self.consecutive_renewal_failures = 0
        self.last_renewal_monotonic_seconds: float | None = None
        self.last_error: str | None = None

    # The agent's view ------------------------------------------------------------------

    @property
    def renewals_failing(self) -> bool:
        """True while the last Lease renewal failed (the fencing rule's input)."""
        return self.consecutive_renewal_failures > 0

    @property
    def running(self) -> bool:
        return any(not t.done() for t in self._tasks)

    def status_changed(self) -> None:
        """Ask for a comparison (and a write, if it differs) without waiting the interval."""
        self._nudge.set()

    async def start(self) -> None:
        if self._tasks:
            raise RuntimeError("the heartbeat is running already")
        self._tasks = [
            asyncio.create_task(self._lease_loop(), name="heartbeat-lease"),
            asyncio.create_task(self._status_loop(), name="heartbeat-swapnode"),
        ]

    async def stop(self) -> None:
        """Stop renewing and writing; the Lease is left to go stale."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> Heartbeat:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # The Lease ---------------------------------------------------------------------------

    async def _lease_loop(self) -> None:
        while True:
            try:
                await self.renew_once()
            except KubeError as e:
                self.consecutive_renewal_failures += 1
                self._failed("lease", e)
            else:
                self.consecutive_renewal_failures = 0
                self.lease_renewals += 1
                self.last_renewal_monotonic_seconds = self._monotonic()
                self._recovered("lease")
                if self._on_renewed is not None:
                    try:
                        self._on_renewed()
                    except Exception:
                        log.exception("on_renewed callback failed")
            await asyncio.sleep(self._settings.renew_interval_seconds)

    async def renew_once(self) -> None:
        """Create or renew the Lease once; KubeError when the API server refuses or is away."""
        s = self._settings
        for attempt in range(2):
            now = self._wall_clock()
            if self._lease is None:
                current = await self._cluster.read_lease(s.lease_namespace, s.node_name)
                if current is None:
                    body = new_lease(name=s.node_name, namespace=s.lease_namespace,
                                     holder=s.holder, duration_seconds=s.lease_duration_seconds,
                                     now=now, owner=self._node)  # fmt: skip
                    try:
                        self._lease = await self._cluster.create_lease(s.lease_namespace, body)
                        return
                    except Conflict:
                        continue  # created meanwhile: read it on the next attempt
                self._lease = current
            body = renewed_lease(self._lease, holder=s.holder,
                                 duration_seconds=s.lease_duration_seconds, now=now)  # fmt: skip
            try:
                self._lease = await self._cluster.replace_lease(s.lease_namespace, body)
                return
            except (Conflict, NotFound):
                self._lease = None  # written or deleted by someone else: read it again
                if attempt:
                    raise

    # The SwapNode ------------------------------------------------------------------------

    async def _status_loop(self) -> None:
        s = self._settings
        while True:
            try:
                await self.write_status_once()
            except KubeError as e:
                self._failed("status", e)
            except Exception as e:  # the report provider is the agent's code
                log.exception("cannot build the SwapNode status")
                self.last_error = f"report: {e}"
            else:
                self._recovered("status")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._nudge.wait(), s.status_interval_seconds)
            self._nudge.clear()
            if self._last_write_at is not None:
                since = self._monotonic() - self._last_write_at
                if since < s.min_status_write_interval_seconds:
                    await asyncio.sleep(s.min_status_write_interval_seconds - since)

    async def write_status_once(self) -> bool:
        """Make sure the SwapNode exists and write its status if it changed; True if written."""
        s = self._settings
        node = await self._current_node()
        if not self._swapnode_ready:
            await self._ensure_swapnode(node)
        status = desired_status(self._report(), node)
        if status == self._last_sent:
            return False
        try:
            await self._cluster.replace_swapnode_status(s.node_name, status)
        except NotFound:
            self._swapnode_ready = False  # deleted behind our back: create it next time
            raise
        self._last_sent = status
        self._last_write_at = self._monotonic()
        self.status_writes += 1
        log.debug("wrote SwapNode %s status", s.node_name)
        return True

    async def _current_node(self) -> NodeFacts:
        now = self._monotonic()
        stale = (
            self._node_read_at is None
            or now - self._node_read_at >= self._settings.node_refresh_seconds
        )
        if self._node is None or stale:
            node = NodeFacts.from_node(await self._cluster.read_node(self._settings.node_name))
            # Check the SwapNode again too: deleted, edited, or owned by a Node of the same
            # name that was deleted meanwhile (a new uid).
            self._swapnode_ready = False
            self._node, self._node_read_at = node, now
        return self._node

    async def _ensure_swapnode(self, node: NodeFacts) -> None:
        name = self._settings.node_name
        existing = await self._cluster.read_swapnode(name)
        if existing is None:
            try:
                existing = await self._cluster.create_swapnode(swapnode_body(node))
                log.info("created SwapNode %s", name)
            except Conflict:
                existing = await self._cluster.read_swapnode(name)
                if existing is None:
                    raise KubeError(f"swapnode {name} vanished while being created") from None
        if not owned_by(existing, node):
            existing = await self._cluster.patch_swapnode(name, owner_patch(existing, node))
            log.info("SwapNode %s now owned by Node uid %s", name, node.uid)
        status = existing.get("status")
        # What the object holds counts as written: a restarted agent with the same report
        # writes nothing.
        self._last_sent = status if isinstance(status, dict) else None
        self._swapnode_ready = True

    # Logging of failures -------------------------------------------------------------------

    def _failed(self, what: str, error: Exception) -> None:
        self.last_error = f"{what}: {error}"
        if what in self._failing:
            log.debug("%s still failing: %s", what, error)
        else:
            self._failing.add(what)
            log.warning("heartbeat %s failing: %s", what, error)

    def _recovered(self, what: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            log.warning("heartbeat %s works again", what)
