"""Requests for a swapped-out model: one swap-in, a bounded FIFO queue, and its limits.

The first request for a model that is not resident starts its swap-in
(`ModelDirectory.ensure_resident`), once per cold period: the queue exists from that
request until the swap-in ends, and requests arriving meanwhile join it rather than
start another. A request finds the queue full when `max_queued` others already wait
(429 QueueFull; with `max_queued` 0 every cold request is refused, but the first still
starts the swap-in). A waiter leaves with 503 QueueTimeout once `queue_timeout_seconds`
have passed since it arrived; the swap-in is not cancelled, so a later retry finds the
model resident. When the swap-in ends, waiters are released in arrival order (each
waiter's task resumes in that order); when it fails, each gets 503 SwapInFailed (or the
`GatewayError` the directory raised, e.g. 404 for a model deleted meanwhile). A
waiter whose client went away (its handler cancelled) leaves the queue in `Ticket.close`.

While a queue exists, a new request queues even if the model already reports resident,
so nobody overtakes an earlier waiter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from modelswap_sidecar.gateway.directory import ModelDirectory, ModelRoute
from modelswap_sidecar.gateway.errors import (
    GatewayError,
    QueueFullError,
    QueueTimeoutError,
    SwapInFailedError,
)

logger = logging.getLogger(__name__)

#: How a wait ended (the queue-wait histogram's `outcome` label).
RELEASED = "released"
TIMED_OUT = "timeout"
FAILED = "failed"
LEFT = "cancelled"


class QueueObserver(Protocol):
    def swap_in_triggered(self, route: ModelRoute) -> None: ...

    def refused(self, route: ModelRoute, reason: str) -> None: ...

    def waited(self, route: ModelRoute, seconds: float, outcome: str) -> None: ...


class _NoObserver:
    def swap_in_triggered(self, route: ModelRoute) -> None:
        pass

    def refused(self, route: ModelRoute, reason: str) -> None:
        pass

    def waited(self, route: ModelRoute, seconds: float, outcome: str) -> None:
        pass


class _ModelQueue:
    def __init__(self, route: ModelRoute) -> None:
        self.route = route
        self.waiters: dict[int, Ticket] = {}  # insertion order is arrival order
        self.swap_in: asyncio.Task[None] | None = None
        self.started_at = 0.0


class Ticket:
    """One request waiting for its model's swap-in. Always `close()` it (in a finally)."""

    def __init__(self, queue: _ModelQueue, owner: SwapInQueues, now: float) -> None:
        self._queue = queue
        self._owner = owner
        self.route = queue.route
        self.entered_at = now
        timeout = queue.route.queue_timeout_seconds
        self.deadline = None if timeout is None else now + timeout
        self._outcome: asyncio.Future[GatewayError | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._closed = False

    @property
    def position(self) -> int:
        """1 for the next to be released; 0 once out of the queue."""
        for index, key in enumerate(self._queue.waiters, start=1):
            if key == id(self):
                return index
        return 0

    async def wait(self, tick_seconds: float | None = None) -> bool:
        """True once released; False when `tick_seconds` passed first (wait again).
        Raises QueueTimeoutError past the deadline, SwapInFailedError if the swap-in failed."""
        now = self._owner.now()
        tick_end = None if tick_seconds is None else now + tick_seconds
        # A loop, not one wait: a timer may fire a little before the clock reads its time
        # (uvloop keeps whole milliseconds), and returning then would let a request
        # without ticks through before its model is resident.
        while not self._outcome.done():
            ends = [end for end in (self.deadline, tick_end) if end is not None]
            if ends and now >= min(ends):
                break
            await asyncio.wait({self._outcome}, timeout=min(ends) - now if ends else None)
            now = self._owner.now()
        if self._outcome.done():
            error = self._outcome.result()
            if error is not None:
                raise error
            return True
        if self.deadline is not None and now >= self.deadline:
            self._finish(TIMED_OUT)
            self._owner.observer.refused(self.route, QueueTimeoutError.reason)
            timeout_seconds = self.route.queue_timeout_seconds
            raise QueueTimeoutError(
                f"{self.route.namespace}/{self.route.name} did not swap in within "
                f"{timeout_seconds:g}s; its swap-in goes on, retry shortly",
                retry_after_seconds=self._owner.retry_after_seconds,
            )
        return False

    def close(self) -> None:
        """Leave the queue if still in it (a client that went away)."""
        if not self._closed:
            self._finish(LEFT)

    def _finish(self, outcome: str) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.waiters.pop(id(self), None)
        self._owner.observer.waited(self.route, self._owner.now() - self.entered_at, outcome)
        self._owner.forget_if_idle(self._queue)

    def _resolve(self, error: GatewayError | None) -> None:
        if not self._outcome.done():
            self._outcome.set_result(error)
        if error is not None and not self._closed:
            self._owner.observer.refused(self.route, error.reason)
        self._finish(RELEASED if error is None else FAILED)


class SwapInQueues:
    """The per-model queues of one gateway."""

    def __init__(
        self,
        directory: ModelDirectory,
        *,
        retry_after_seconds: int,
        observer: QueueObserver | None = None,
        now: Callable[[], float] | None = None,
    ) -> None:
        self._directory = directory
        self.retry_after_seconds = retry_after_seconds
        self.observer: QueueObserver = observer or _NoObserver()
        self._now = now
        self._queues: dict[str, _ModelQueue] = {}

    def now(self) -> float:
        return self._now() if self._now else asyncio.get_running_loop().time()

    def enter(self, route: ModelRoute) -> Ticket | None:
        """None when the model serves now; else a place in its queue (the swap-in started
        if it was not running). Raises QueueFullError."""
        queue = self._queues.get(route.uid)
        if queue is None:
            if self._directory.is_resident(route.uid):
                return None
            queue = self._queues[route.uid] = _ModelQueue(route)
        queue.route = route  # the newest policy (max_queued, queue timeout)
        if queue.swap_in is None:
            self._start_swap_in(queue)
        if len(queue.waiters) >= route.max_queued:
            self.observer.refused(route, QueueFullError.reason)
            self.forget_if_idle(queue)
            raise QueueFullError(
                f"{route.namespace}/{route.name} is swapping in and {route.max_queued} "
                "requests already wait for it",
                retry_after_seconds=self.retry_after_seconds,
            )
        ticket = Ticket(queue, self, self.now())
        queue.waiters[id(ticket)] = ticket
        return ticket

    def depth(self, uid: str) -> int:
        queue = self._queues.get(uid)
        return len(queue.waiters) if queue else 0

    def depths(self) -> list[tuple[ModelRoute, int]]:
        return [(queue.route, len(queue.waiters)) for queue in list(self._queues.values())]

    def swap_in_running(self, uid: str) -> bool:
        queue = self._queues.get(uid)
        return queue is not None and queue.swap_in is not None

    def forget_if_idle(self, queue: _ModelQueue) -> None:
        idle = queue.swap_in is None and not queue.waiters
        if idle and self._queues.get(queue.route.uid) is queue:
            del self._queues[queue.route.uid]

    async def close(self) -> None:
        """Cancel running swap-ins (the gateway is shutting down)."""
        queues = list(self._queues.values())
        tasks = [q.swap_in for q in queues if q.swap_in is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for queue in queues:  # a swap-in cancelled before it ran released nobody
            queue.swap_in = None
            for ticket in list(queue.waiters.values()):
                ticket._resolve(self._shutting_down())
            self.forget_if_idle(queue)

    def _shutting_down(self) -> SwapInFailedError:
        return SwapInFailedError(
            "the gateway is shutting down", retry_after_seconds=self.retry_after_seconds
        )

    def _start_swap_in(self, queue: _ModelQueue) -> None:
        queue.started_at = self.now()
        self.observer.swap_in_triggered(queue.route)
        logger.info("swap-in requested for %s/%s", queue.route.namespace, queue.route.name)
        queue.swap_in = asyncio.create_task(
            self._swap_in(queue), name=f"gateway-swap-in-{queue.route.uid}"
        )

    async def _swap_in(self, queue: _ModelQueue) -> None:
        route = queue.route
        error: GatewayError | None = None
        try:
            await self._directory.ensure_resident(route.uid)
        except asyncio.CancelledError:
            error = self._shutting_down()
            raise
        except GatewayError as e:  # SwapInFailedError, or e.g. a model deleted meanwhile
            error = e
            if isinstance(e, SwapInFailedError) and e.retry_after_seconds is None:
                e.retry_after_seconds = self.retry_after_seconds
        except Exception as e:
            logger.exception("swap-in of %s/%s failed", route.namespace, route.name)
            error = SwapInFailedError(
                f"{route.namespace}/{route.name} could not be swapped in: {e}",
                retry_after_seconds=self.retry_after_seconds,
            )
        finally:
            queue.swap_in = None
            waiters = list(queue.waiters.values())
            if error is None:
                logger.info(
                    "%s/%s swapped in after %.3fs; releasing %d waiting requests",
                    route.namespace,
                    route.name,
                    self.now() - queue.started_at,
                    len(waiters),
                )
            for ticket in waiters:  # arrival order
                ticket._resolve(error)
            self.forget_if_idle(queue)
