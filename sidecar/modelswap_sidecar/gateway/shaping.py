"""Batch shaping by prompt length (`spec.gateway.batchShaping`, issue 29 item 5).

A model that batches concurrent requests pads every prompt of a batch to the longest one.
With shaping on (`ModelRoute.shaping_wait_seconds` above 0), a session-less generate
request for a resident model waits in the bucket its prompt's UTF-8 bytes fall in
(`bucket_of`: n edges make n+1 buckets) before it goes to Triton. The first request of an
empty bucket opens it for `shaping_wait_seconds`; when that window ends the bucket's
requests are released together, in arrival order, and buckets of one model due at the same
moment go out shorter first. So the requests reach the model in runs of similar length and
its batches mix fewer lengths. No request waits longer than the window (plus the event
loop's lateness).

The requests of one released bucket carry its group (`parameters.batch_group`, a number
unique per model while the gateway runs; `tagged`): a batching model keeps a group's
requests together and apart from others' (tinyllama's batcher does), since arrival order
alone does not keep them together: the requests reach Triton over separate connections,
and a batch that starts while part of a group is still on its way would take the next
group's first requests with it.

Buckets count bytes, not tokens: the gateway has no tokenizer (it is the model's), and the
bytes of a prompt are what it already measures (`spec.gateway.maxPromptBytes`); for one
language bytes per token are near constant, so byte buckets order prompts as token buckets
would.

Off (a wait of 0) the gateway never calls in here: requests go to Triton as they did.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from modelswap_sidecar.gateway.directory import ModelRoute

#: The generate parameter naming a request's released group.
GROUP_PARAMETER = "batch_group"


@dataclass(frozen=True)
class Held:
    """How long a request waited in its bucket, and the group it was released with (None:
    it was not held)."""

    seconds: float
    group: str | None


NOT_HELD = Held(0.0, None)


def tagged(
    json_body: Mapping[str, Any] | None, body: bytes | None, group: str | None
) -> tuple[Mapping[str, Any] | None, bytes | None]:
    """The request's body (a JSON object, or its bytes) with `parameters.batch_group` set to
    `group`; unchanged when `group` is None or its `parameters` is not an object (the
    model refuses that itself)."""
    if group is None:
        return json_body, body
    if json_body is not None:
        return _with_group(json_body, group) or json_body, body
    if body is not None:
        fields = json.loads(body)  # checked as a JSON object before it was admitted
        changed = _with_group(fields, group) if isinstance(fields, Mapping) else None
        return json_body, body if changed is None else json.dumps(changed).encode()
    return json_body, body


def _with_group(fields: Mapping[str, Any], group: str) -> dict[str, Any] | None:
    parameters = fields.get("parameters", {})
    if not isinstance(parameters, Mapping):
        return None
    return {**fields, "parameters": {**parameters, GROUP_PARAMETER: group}}


def bucket_of(edges_bytes: tuple[int, ...], prompt_bytes: int) -> int:
    """The bucket of a prompt of `prompt_bytes`: 0 below the first edge, i from edge i-1
    (included) to edge i, len(edges) at or past the last."""
    return bisect.bisect_right(edges_bytes, prompt_bytes)


@dataclass
class _Bucket:
    index: int
    deadline: float
    waiters: list[asyncio.Future[str]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class BatchShaper:
    """The gateway's open buckets, per model."""

    def __init__(self, now: Callable[[], float] | None = None) -> None:
        self._now = now
        #: model uid → bucket index → its open bucket
        self._open: dict[str, dict[int, _Bucket]] = {}
        #: requests released so far, per model (what tests and metrics read)
        self.released: dict[str, int] = {}
        self._groups = itertools.count(1)

    def now(self) -> float:
        return self._now() if self._now else asyncio.get_running_loop().time()

    def waiting(self, uid: str) -> int:
        return sum(len(b.waiters) for b in self._open.get(uid, {}).values())

    async def hold(self, route: ModelRoute, prompt_bytes: int) -> Held:
        """Wait until the bucket of `prompt_bytes` is released; the seconds waited and the
        group released. A route with shaping off returns at once (callers skip the call)."""
        if route.shaping_wait_seconds <= 0:
            return NOT_HELD
        loop = asyncio.get_running_loop()
        started = self.now()
        index = bucket_of(route.shaping_edges_bytes, prompt_bytes)
        buckets = self._open.setdefault(route.uid, {})
        bucket = buckets.get(index)
        if bucket is None:
            bucket = buckets[index] = _Bucket(index, started + route.shaping_wait_seconds)
            # call_at on the loop's clock: the deadline is in `now()`'s terms, which is the
            # loop's unless a test injects a clock (then it drives releases itself)
            delay = max(0.0, bucket.deadline - started)
            bucket.timer = loop.call_later(delay, self.release_due, route.uid)
        waiter: asyncio.Future[str] = loop.create_future()
        bucket.waiters.append(waiter)
        try:
            group = await waiter
        finally:
            if not waiter.done() or waiter.cancelled():
                self._leave(route.uid, bucket, waiter)
        return Held(self.now() - started, group)

    def release_due(self, uid: str) -> None:
        """Release every bucket of `uid` whose window has ended, shorter buckets first."""
        buckets = self._open.get(uid)
        if not buckets:
            return
        now = self.now()
        # a timer may fire a little before the clock reads its deadline (uvloop keeps whole
        # milliseconds): a bucket within 2 ms of its end counts as due
        due = sorted((b for b in buckets.values() if b.deadline <= now + 0.002), key=_index)
        for bucket in due:
            del buckets[bucket.index]
            if bucket.timer is not None:
                bucket.timer.cancel()
            group = str(next(self._groups))
            for waiter in bucket.waiters:  # arrival order
                if not waiter.done():
                    waiter.set_result(group)
            self.released[uid] = self.released.get(uid, 0) + len(bucket.waiters)
        if not buckets:
            del self._open[uid]

    def _leave(self, uid: str, bucket: _Bucket, waiter: asyncio.Future[str]) -> None:
        """A waiter whose client went away leaves its bucket; an emptied bucket closes."""
        if waiter in bucket.waiters:
            bucket.waiters.remove(waiter)
        buckets = self._open.get(uid, {})
        if not bucket.waiters and buckets.get(bucket.index) is bucket:
            del buckets[bucket.index]
            if bucket.timer is not None:
                bucket.timer.cancel()
            if not buckets:
                self._open.pop(uid, None)

    def close(self) -> None:
        """Release everyone (the gateway is shutting down: their calls end on their own)."""
        for uid in list(self._open):
            for bucket in self._open[uid].values():
                bucket.deadline = float("-inf")
            self.release_due(uid)


def _index(bucket: _Bucket) -> int:
    return bucket.index
