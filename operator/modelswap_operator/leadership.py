"""Leader election: one operator process at a time does the work, fenced by a term.

kopf's own peering freezes every peer of equal priority, so the operators elect a leader
with a Lease (coordination.k8s.io/v1) in the operator's namespace, as client-go does:

- `acquire()` waits until this process holds the Lease: it creates it when absent
  (`leaseTransitions` 0) or takes it over once `renewTime + leaseDurationSeconds` is past
  or its holder released it (`leaseTransitions` + 1). Every write is a PUT carrying the
  resourceVersion it read, so of two processes taking over at once one gets a Conflict and
  goes back to waiting.
- The **term** is the Lease's `leaseTransitions` after acquisition. Agents order the
  operator's desired sets by (term, counter) and refuse older revisions, so each
  acquisition must start a term no one used before: the identity carries a random nonce
  per process start (`unique_identity`), and even this process re-acquiring a Lease that
  still names it counts a transition. A deleted Lease starts again at 0, so the term a
  leader pushes under is raised above every term the agents have seen (`terms`,
  `Reconciler`); `confirm()` proves it still leads before it does so mid-term.
- `hold()` renews every `renew_interval_seconds` and raises `LeadershipLost` when a renewal
  finds another holder (or no Lease), or when no renewal has succeeded for
  `lease_duration_seconds` (another process may have taken over by then).
- `release()` on clean shutdown empties the holder so a peer takes over at once instead
  of after a lease duration.

Expiry is judged from `renewTime` with this process's clock: the operators' clocks must
agree to well within a lease duration (as they must for the node Leases).

`decide` is the pure part (lease dict in, action out); `LeaderElector` does the I/O through
`modelswap_api.kube`, in a thread (or the executor given), never on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import logging
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

from modelswap_api import kube

log = logging.getLogger(__name__)
T = TypeVar("T")

MICRO_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
LEASE_API_VERSION = "coordination.k8s.io/v1"


class LeadershipLost(Exception):  # noqa: N818 - a state, like kube.NotFound
    """This process no longer holds (or can no longer prove it holds) the leader Lease."""


def unique_identity(pod_name: str | None = None) -> str:
    """`pod_name` (default: the host name, which is the pod name in a pod) plus a random
    nonce. A restarted leader with its old identity would find the Lease still naming it
    and keep the old term, restarting its revision counter from 0 — which agents refuse
    as OlderRevision; a fresh identity makes the take-over count a transition."""
    return f"{pod_name or socket.gethostname()}-{secrets.token_hex(3)}"


def micro_time(epoch_seconds: float) -> str:
    """A MicroTime (`2006-01-02T15:04:05.000000Z`), as Lease times are written."""
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime(MICRO_TIME_FORMAT)


def parse_micro_time(text: str) -> float:
    """Epoch seconds of a MicroTime or RFC 3339 time as the API server writes it."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# What to do with the Lease as read. Write actions carry the whole new `spec`.


@dataclass(frozen=True)
class Create:
    """No Lease: create it, held by us, first term (0)."""

    spec: Mapping[str, Any]


@dataclass(frozen=True)
class TakeOver:
    """Expired, released, or ours from before: take it, a new term."""

    spec: Mapping[str, Any]


@dataclass(frozen=True)
class Renew:
    """Ours and we are leading: push renewTime on, same term."""

    spec: Mapping[str, Any]


@dataclass(frozen=True)
class Wait:
    """Held by `holder` and fresh for another `expires_in_seconds`."""

    holder: str
    expires_in_seconds: float


@dataclass(frozen=True)
class Lost:
    """While leading, the Lease names `holder` (empty when it is gone or released)."""

    holder: str


Action = Create | TakeOver | Renew | Wait | Lost


def term_of(lease_or_spec: Mapping[str, Any]) -> int:
    """`leaseTransitions` of a Lease (or of its spec), 0 when unset."""
    spec = lease_or_spec.get("spec", lease_or_spec)
    return int((spec or {}).get("leaseTransitions") or 0)


def expires_at(spec: Mapping[str, Any]) -> float | None:
    """When the holder's claim runs out (epoch seconds); None when the Lease carries no
    time to judge by (treated as expired: nothing shows anyone renews it)."""
    stamp = spec.get("renewTime") or spec.get("acquireTime")
    duration_seconds = spec.get("leaseDurationSeconds")
    if not stamp or not duration_seconds:
        return None
    try:
        return parse_micro_time(str(stamp)) + float(duration_seconds)
    except ValueError:
        return None


def decide(
    lease: Mapping[str, Any] | None,
    identity: str,
    now: float,
    *,
    lease_duration_seconds: int,
    leading: bool = False,
) -> Action:
    """What `identity` should do with `lease` (None: absent) at `now` (epoch seconds).

    `leading` says whether this process is holding the Lease (renewing) rather than
    acquiring it. A leader only renews what still names it; anything else is `Lost`. An
    acquirer never renews: a Lease that names it from before (a renewal that failed,
    leadership given up) is taken over, so the new acquisition gets a new term.
    """
    stamp = micro_time(now)
    if lease is None:
        if leading:
            return Lost(holder="")
        return Create(spec={
            "holderIdentity": identity,
            "leaseDurationSeconds": lease_duration_seconds,
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": 0,
        })  # fmt: skip
    spec = dict(lease.get("spec") or {})
    holder = str(spec.get("holderIdentity") or "")
    if leading:
        if holder != identity:
            return Lost(holder=holder)
        return Renew(spec={**spec, "leaseDurationSeconds": lease_duration_seconds,
                           "renewTime": stamp})  # fmt: skip
    expiry = expires_at(spec)
    if holder and holder != identity and expiry is not None and now < expiry:
        return Wait(holder=holder, expires_in_seconds=expiry - now)
    return TakeOver(spec={
        **spec,
        "holderIdentity": identity,
        "leaseDurationSeconds": lease_duration_seconds,
        "acquireTime": stamp,
        "renewTime": stamp,
        "leaseTransitions": term_of(spec) + 1,
    })  # fmt: skip


class LeaderElector:
    """Holds the Lease `namespace/name` as `identity` (see the module docstring).

    `api` is a `kube.api_client(...)`; blocking calls run in `executor` (the loop's default
    when None). `clock` answers epoch seconds (times are written into the Lease, so it is
    wall-clock time, not monotonic). Each request is bounded by `request_timeout_seconds`
    (default: half the lease duration, 1 to 10 s), so a hung call cannot outlast the term.
    """

    def __init__(
        self,
        api: Any,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration_seconds: int = 15,
        renew_interval_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
        executor: concurrent.futures.Executor | None = None,
        request_timeout_seconds: float | None = None,
    ) -> None:
        if lease_duration_seconds < 1:
            raise ValueError(
                "lease_duration_seconds must be at least 1 (a Lease holds whole seconds)"
            )
        if not 0 < renew_interval_seconds < lease_duration_seconds:
            raise ValueError("renew_interval_seconds must be above 0 and below the lease duration")
        if not identity:
            raise ValueError("identity must not be empty (an empty holder means released)")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_seconds = lease_duration_seconds
        self.renew_interval_seconds = renew_interval_seconds
        self._clock = clock
        self._executor = executor
        self._timeout_seconds = request_timeout_seconds or min(
            kube.DEFAULT_TIMEOUT_SECONDS, max(1.0, lease_duration_seconds / 2)
        )
        self._term: int | None = None
        self._leading = False
        self._renewed_at = 0.0  # clock() when the last successful write was sent

    @property
    def term(self) -> int | None:
        """The term of the current (or last) acquisition; None before the first."""
        return self._term

    @property
    def leading(self) -> bool:
        """True from `acquire()` until leadership is lost or released."""
        return self._leading

    async def acquire(self) -> int:
        """Wait until this process holds the Lease; answer the term. Conflicts (another
        process wrote first) and API errors are retried every renew interval."""
        while True:
            now = self._clock()
            try:
                lease = await self._blocking(kube.read_lease, self.namespace, self.name)
                action = decide(lease, self.identity, now,
                                lease_duration_seconds=self.lease_duration_seconds)  # fmt: skip
                if isinstance(action, Create):
                    written = await self._blocking(kube.create_lease, self.namespace,
                                                   self._body(None, action.spec))  # fmt: skip
                elif isinstance(action, TakeOver):
                    assert lease is not None
                    written = await self._blocking(kube.replace_lease, self.namespace,
                                                   self._body(lease, action.spec))  # fmt: skip
                else:
                    assert isinstance(action, Wait)
                    log.debug("leader lease %s/%s is held by %s for %.1fs more",
                              self.namespace, self.name, action.holder,
                              action.expires_in_seconds)  # fmt: skip
                    await asyncio.sleep(min(self.renew_interval_seconds, action.expires_in_seconds))
                    continue
            except kube.Conflict:
                # Another process wrote first: read again soon (not in a tight loop).
                await asyncio.sleep(self.renew_interval_seconds / 10)
                continue
            except kube.KubeError as e:
                log.warning("cannot acquire leader lease %s/%s: %s", self.namespace, self.name, e)
                await asyncio.sleep(self.renew_interval_seconds)
                continue
            self._term = term_of(written)
            self._renewed_at = now
            self._leading = True
            log.info("leading as %s, term %d (lease %s/%s)",
                     self.identity, self._term, self.namespace, self.name)  # fmt: skip
            return self._term

    async def confirm(self) -> bool:
        """Whether the Lease, read now, still names this process as its holder (and it
        has not lost or released it). False when the Lease cannot be read: only a leader
        that can prove it leads may raise its term above what the agents have seen
        (`terms`), or a deposed leader that has not noticed yet would outrank its
        successor."""
        if not self._leading:
            return False
        try:
            lease = await self._blocking(kube.read_lease, self.namespace, self.name)
        except kube.KubeError as e:
            log.warning("cannot read leader lease %s/%s: %s", self.namespace, self.name, e)
            return False
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
        return self._leading and holder == self.identity

    async def hold(self) -> NoReturn:
        """Renew the Lease every renew interval while leading; raise `LeadershipLost` when
        a renewal finds another holder or no Lease, or when no renewal has succeeded for a
        lease duration. Cancelling it stops renewing without releasing (a peer then takes
        over once the Lease expires)."""
        if not self._leading:
            raise LeadershipLost(f"{self.identity} does not hold {self.namespace}/{self.name}")
        while True:
            deadline = self._renewed_at + self.lease_duration_seconds
            await asyncio.sleep(
                max(0.0, min(self.renew_interval_seconds, deadline - self._clock()))
            )
            try:
                await self._renew()
            except LeadershipLost:
                self._leading = False
                raise
            except kube.KubeError as e:  # Conflict included: the next read tells who wrote
                log.warning("cannot renew leader lease %s/%s: %s", self.namespace, self.name, e)
            unrenewed_seconds = self._clock() - self._renewed_at
            if unrenewed_seconds >= self.lease_duration_seconds:
                self._leading = False
                raise LeadershipLost(
                    f"the leader lease {self.namespace}/{self.name} was not renewed for "
                    f"{unrenewed_seconds:.1f}s (lease duration {self.lease_duration_seconds}s): "
                    "another operator may have taken over"
                )

    async def release(self) -> bool:
        """On clean shutdown: empty the holder (the term stays; the next taker counts a
        transition) so a peer takes over at once. Only while the Lease still names us;
        answers whether it was released. Errors are logged, not raised: the Lease then
        simply expires."""
        self._leading = False
        try:
            lease = await self._blocking(kube.read_lease, self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return False
            spec = dict(lease["spec"])
            spec.pop("holderIdentity", None)
            spec.update(leaseDurationSeconds=1, renewTime=micro_time(self._clock()))
            await self._blocking(kube.replace_lease, self.namespace, self._body(lease, spec))
        except kube.KubeError as e:
            log.warning("cannot release leader lease %s/%s: %s", self.namespace, self.name, e)
            return False
        log.info("released leader lease %s/%s (term %s)", self.namespace, self.name, self._term)
        return True

    async def lead(self, work: Callable[[int], Awaitable[T]]) -> T:
        """Acquire, then run `work(term)` while holding the Lease. When leadership is lost,
        `work` is cancelled and `LeadershipLost` raised; when `work` ends (or fails), the
        Lease is released and its result (or error) passed on; cancelling `lead` cancels
        `work` and releases (a clean shutdown)."""
        term = await self.acquire()
        working = asyncio.ensure_future(work(term))
        holding = asyncio.ensure_future(self.hold())
        try:
            await asyncio.wait({working, holding}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await _stop(working, holding)
            await self.release()
            raise
        finished = working.done()
        await _stop(working, holding)
        if finished:
            await self.release()
            return working.result()
        return holding.result()  # LeadershipLost: hold() never returns

    async def _renew(self) -> None:
        now = self._clock()
        lease = await self._blocking(kube.read_lease, self.namespace, self.name)
        duration_seconds = self.lease_duration_seconds
        action = decide(
            lease, self.identity, now, lease_duration_seconds=duration_seconds, leading=True
        )
        if isinstance(action, Lost):
            raise LeadershipLost(
                f"the leader lease {self.namespace}/{self.name} is now held by "
                f"{action.holder or 'nobody'} (we were {self.identity}, term {self._term})"
            )
        assert isinstance(action, Renew) and lease is not None
        await self._blocking(kube.replace_lease, self.namespace, self._body(lease, action.spec))
        self._renewed_at = now

    def _body(self, read: Mapping[str, Any] | None, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The Lease to write: `read` (its resourceVersion kept, so a concurrent writer
        makes this a Conflict) with `spec`, or a new Lease when `read` is None."""
        if read is None:
            return {"apiVersion": LEASE_API_VERSION, "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": dict(spec)}  # fmt: skip
        body = copy.deepcopy(dict(read))
        body["spec"] = dict(spec)
        return body

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        call = functools.partial(fn, self.api, *args, timeout_seconds=self._timeout_seconds)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)


async def _stop(*tasks: asyncio.Future[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
