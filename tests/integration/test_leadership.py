"""Leader election against the API emulator: two operators (electors with their own
clients) in one event loop, short leases (1 s, renewed every 0.2 s).

Exactly one leads; a leader that stops without releasing is replaced once its Lease has
expired, in the next term; a released Lease is taken at once; a leader whose Lease was
taken, or which cannot renew for a lease duration, learns it has lost."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio
import yaml

from modelswap_api import kube
from modelswap_operator.leadership import (
    LeaderElector,
    LeadershipLost,
    parse_micro_time,
    unique_identity,
)
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.waiting import until_async

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

T = TypeVar("T")
NAMESPACE = "modelswap-system"
LEASE = "modelswap-operator-leader"
LEASE_SECONDS = 1
RENEW_SECONDS = 0.2


@pytest.fixture
def cluster() -> Iterator[EmulatorThread]:
    with EmulatorThread() as emulator:
        emulator.create({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": NAMESPACE}})  # fmt: skip
        yield emulator


@pytest.fixture
def clients(cluster: EmulatorThread) -> Iterator[Callable[[], Any]]:
    """A fresh ApiClient per operator (closed at the end)."""
    made: list[Any] = []

    def new() -> Any:
        made.append(kube.api_client(str(cluster.kubeconfig_path)))
        return made[-1]

    yield new
    for api in made:
        api.close()


@pytest_asyncio.fixture
async def tasks() -> AsyncIterator[list[asyncio.Task[Any]]]:
    """Tasks a test starts; cancelled and awaited at its end."""
    started: list[asyncio.Task[Any]] = []
    yield started
    for task in started:
        task.cancel()
    await asyncio.gather(*started, return_exceptions=True)


def elector(api: Any, pod: str, lease_seconds: int = LEASE_SECONDS) -> LeaderElector:
    return LeaderElector(api, NAMESPACE, LEASE, unique_identity(pod),
                         lease_duration_seconds=lease_seconds,
                         renew_interval_seconds=RENEW_SECONDS)  # fmt: skip


async def read(api: Any) -> dict[str, Any]:
    lease = await asyncio.to_thread(kube.read_lease, api, NAMESPACE, LEASE)
    assert lease is not None
    return lease


async def first_done(*running: asyncio.Task[T], timeout_seconds: float) -> asyncio.Task[T]:
    done, _ = await asyncio.wait(running, timeout=timeout_seconds,
                                 return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
    assert done, f"none finished within {timeout_seconds}s"
    return done.pop()


async def test_exactly_one_of_two_leads_and_keeps_renewing(
    clients: Callable[[], Any], tasks: list[asyncio.Task[Any]]
) -> None:
    a, b = elector(clients(), "op-a"), elector(clients(), "op-b")
    acquiring = {asyncio.create_task(a.acquire()): a, asyncio.create_task(b.acquire()): b}
    tasks.extend(acquiring)
    won = await first_done(*acquiring, timeout_seconds=10)
    leader = acquiring[won]
    other = b if leader is a else a
    assert won.result() == 0 == leader.term  # created: the first term
    tasks.append(asyncio.create_task(leader.hold()))

    # Several lease durations of renewals, and the other is still waiting.
    api = clients()
    first_renewal = parse_micro_time((await read(api))["spec"]["renewTime"])

    async def renewed_for_three_durations() -> bool:
        lease = await read(api)
        spec = lease["spec"]
        assert spec["holderIdentity"] == leader.identity
        return parse_micro_time(spec["renewTime"]) - first_renewal > 3 * LEASE_SECONDS

    await until_async(renewed_for_three_durations, "three lease durations of renewals", 10)
    assert not other.leading and other.term is None
    assert not next(t for t in acquiring if t is not won).done()
    assert (await read(api))["spec"]["leaseTransitions"] == 0


async def test_a_stopped_leader_is_replaced_after_the_lease_expires_in_the_next_term(
    clients: Callable[[], Any], tasks: list[asyncio.Task[Any]]
) -> None:
    a, b = elector(clients(), "op-a"), elector(clients(), "op-b")
    api = clients()
    assert await a.acquire() == 0
    holding = asyncio.create_task(a.hold())
    tasks.append(holding)
    await until_async(lambda: _renewed_by(api, a.identity), "a renewal by the leader", 5)
    acquiring = asyncio.create_task(b.acquire())
    tasks.append(acquiring)

    holding.cancel()  # a crash: no release
    with contextlib.suppress(asyncio.CancelledError):
        await holding
    last_renewal = parse_micro_time((await read(api))["spec"]["renewTime"])

    assert await asyncio.wait_for(acquiring, timeout=10) == 1
    spec = (await read(api))["spec"]
    assert spec["holderIdentity"] == b.identity and spec["leaseTransitions"] == 1
    # Not before the stopped leader's claim ran out.
    assert parse_micro_time(spec["acquireTime"]) >= last_renewal + LEASE_SECONDS - 0.01


async def test_a_released_lease_is_taken_over_at_once(
    clients: Callable[[], Any], tasks: list[asyncio.Task[Any]]
) -> None:
    lease_seconds = 30  # far longer than the take-over may take
    a = elector(clients(), "op-a", lease_seconds)
    b = elector(clients(), "op-b", lease_seconds)
    api = clients()
    assert await a.acquire() == 0
    holding = asyncio.create_task(a.hold())
    tasks.append(holding)
    acquiring = asyncio.create_task(b.acquire())
    tasks.append(acquiring)
    await until_async(lambda: _renewed_by(api, a.identity), "a renewal by the leader", 5)
    assert not acquiring.done()

    holding.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await holding
    released_at = time.monotonic()
    assert await a.release() is True
    assert await asyncio.wait_for(acquiring, timeout=5) == 1
    assert time.monotonic() - released_at < lease_seconds / 3
    assert await a.release() is False  # no longer ours: left alone
    assert (await read(api))["spec"]["holderIdentity"] == b.identity


async def test_a_renewal_that_finds_another_holder_raises_leadership_lost(
    clients: Callable[[], Any], tasks: list[asyncio.Task[Any]]
) -> None:
    a = elector(clients(), "op-a", lease_seconds=30)
    await a.acquire()
    holding = asyncio.create_task(a.hold())
    tasks.append(holding)

    # Someone else writes the Lease (e.g. a peer that judged it expired by its clock).
    api = clients()
    lease = await read(api)
    lease["spec"]["holderIdentity"] = "intruder"
    lease["spec"]["leaseTransitions"] += 1
    await asyncio.to_thread(kube.replace_lease, api, NAMESPACE, lease)

    with pytest.raises(LeadershipLost, match="intruder"):
        await asyncio.wait_for(holding, timeout=5)
    assert not a.leading
    assert await a.release() is False
    assert (await read(api))["spec"]["holderIdentity"] == "intruder"


async def test_renewals_failing_for_a_lease_duration_raise_leadership_lost(
    clients: Callable[[], Any], tasks: list[asyncio.Task[Any]], tmp_path: Path
) -> None:
    a = elector(clients(), "op-a")
    await a.acquire()
    began = time.monotonic()
    a.api = kube.api_client(str(_unreachable_kubeconfig(tmp_path)))  # the API server is gone
    try:
        holding = asyncio.create_task(a.hold())
        tasks.append(holding)
        with pytest.raises(LeadershipLost, match="not renewed"):
            await asyncio.wait_for(holding, timeout=10)
        assert time.monotonic() - began >= LEASE_SECONDS - 0.05
        assert not a.leading
    finally:
        a.api.close()


async def test_lead_runs_the_work_while_leading_and_cancels_it_when_lost(
    clients: Callable[[], Any], tasks: list[asyncio.Task[Any]]
) -> None:
    a = elector(clients(), "op-a", lease_seconds=30)
    terms: list[int] = []
    cancelled = asyncio.Event()

    async def work(term: int) -> None:
        terms.append(term)
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    leading = asyncio.create_task(a.lead(work))
    tasks.append(leading)
    await until_async(lambda: _async(bool(terms)), "the work to start", 5)
    assert terms == [0]

    api = clients()
    lease = await read(api)
    lease["spec"]["holderIdentity"] = "intruder"
    await asyncio.to_thread(kube.replace_lease, api, NAMESPACE, lease)
    with pytest.raises(LeadershipLost):
        await asyncio.wait_for(leading, timeout=5)
    assert cancelled.is_set()


async def test_lead_releases_when_the_work_ends(clients: Callable[[], Any]) -> None:
    a = elector(clients(), "op-a", lease_seconds=30)

    async def work(term: int) -> str:
        return f"done in term {term}"

    assert await a.lead(work) == "done in term 0"
    spec = (await read(clients()))["spec"]
    assert not spec.get("holderIdentity")
    b = elector(clients(), "op-b", lease_seconds=30)
    assert await asyncio.wait_for(b.acquire(), timeout=5) == 1


async def _renewed_by(api: Any, identity: str) -> bool:
    spec = (await read(api))["spec"]
    return bool(spec["holderIdentity"] == identity and spec["renewTime"] != spec["acquireTime"])


async def _async(value: T) -> T:
    return value


def _unreachable_kubeconfig(tmp_path: Path) -> Path:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))  # fmt: skip
    return path
