"""The per-model swap-in queue on its own: one swap-in per cold period, FIFO release,
limits, timeouts, failures and clients that leave (no HTTP)."""

from __future__ import annotations

import asyncio

import pytest

from modelswap_sidecar.gateway.errors import (
    QueueFullError,
    QueueTimeoutError,
    SwapInFailedError,
    UnknownModelError,
)
from modelswap_sidecar.gateway.queueing import SwapInQueues, Ticket
from tests.support.gateway_fakes import FakeDirectory, refuse, route
from tests.support.waiting import until_on_loop


class Recorder:
    def __init__(self) -> None:
        self.triggered: list[str] = []
        self.refusals: list[str] = []
        self.waits: list[str] = []

    def swap_in_triggered(self, route: object) -> None:
        self.triggered.append("x")

    def refused(self, route: object, reason: str) -> None:
        self.refusals.append(reason)

    def waited(self, route: object, seconds: float, outcome: str) -> None:
        self.waits.append(outcome)


def queues_for(directory: FakeDirectory) -> tuple[SwapInQueues, Recorder]:
    recorder = Recorder()
    return SwapInQueues(directory, retry_after_seconds=2, observer=recorder), recorder


async def waiting(ticket: Ticket | None) -> None:
    assert ticket is not None
    try:
        await ticket.wait()
    finally:
        ticket.close()


@pytest.mark.asyncio
async def test_resident_models_do_not_queue() -> None:
    model = route("llama")
    directory = FakeDirectory([model], resident=[model.uid])
    queues, recorder = queues_for(directory)
    assert queues.enter(model) is None
    assert directory.swap_ins[model.uid] == 0 and not recorder.triggered


@pytest.mark.asyncio
async def test_one_swap_in_and_release_in_arrival_order() -> None:
    model = route("llama")
    directory = FakeDirectory([model])
    directory.hold(model.uid)
    queues, recorder = queues_for(directory)
    order: list[int] = []

    async def one(index: int) -> None:
        ticket = queues.enter(model)
        assert ticket is not None
        assert ticket.position == index + 1
        await waiting(ticket)
        order.append(index)

    tasks = [asyncio.create_task(one(i)) for i in range(20)]
    await until_on_loop(lambda: queues.depth(model.uid) == 20, "20 queued")
    assert directory.swap_ins[model.uid] == 1 and queues.swap_in_running(model.uid)
    directory.release(model.uid)
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order == list(range(20))
    assert directory.swap_ins[model.uid] == 1 and directory.completed[model.uid] == 1
    assert queues.depths() == [] and recorder.triggered == ["x"]
    assert recorder.waits == ["released"] * 20
    # Resident now: no queue; after the next swap-out, a new cold period, one more swap-in.
    assert queues.enter(model) is None
    directory.swap_out(model.uid)
    await waiting(queues.enter(model))
    assert directory.swap_ins[model.uid] == 2


@pytest.mark.asyncio
async def test_arrivals_during_a_swap_in_do_not_overtake_the_queue() -> None:
    model = route("llama")
    directory = FakeDirectory([model])
    directory.hold(model.uid)
    queues, _ = queues_for(directory)
    first = queues.enter(model)
    directory.resident.add(model.uid)  # the engine says resident before the swap-in returns
    second = queues.enter(model)
    assert first is not None and second is not None and second.position == 2
    directory.release(model.uid)
    await asyncio.wait_for(asyncio.gather(waiting(first), waiting(second)), 10)


@pytest.mark.asyncio
async def test_a_full_queue_refuses_and_zero_still_starts_the_swap_in() -> None:
    model = route("llama", max_queued=2)
    directory = FakeDirectory([model])
    directory.hold(model.uid)
    queues, recorder = queues_for(directory)
    tickets = [queues.enter(model), queues.enter(model)]
    with pytest.raises(QueueFullError) as caught:
        queues.enter(model)
    assert caught.value.retry_after_seconds == 2 and caught.value.status == 429
    assert recorder.refusals == ["QueueFull"]
    directory.release(model.uid)
    await asyncio.wait_for(asyncio.gather(*(waiting(t) for t in tickets)), 10)

    never = route("bert", max_queued=0)
    directory.table.replace([model, never])
    with pytest.raises(QueueFullError):
        queues.enter(never)
    await until_on_loop(
        lambda: directory.completed[never.uid] == 1, "the swap-in of a maxQueued=0 model"
    )
    assert queues.enter(never) is None


@pytest.mark.asyncio
async def test_a_timed_out_waiter_leaves_and_the_swap_in_goes_on() -> None:
    model = route("llama", queue_timeout_seconds=0.05)
    directory = FakeDirectory([model])
    directory.hold(model.uid)
    queues, recorder = queues_for(directory)
    ticket = queues.enter(model)
    assert ticket is not None
    with pytest.raises(QueueTimeoutError) as caught:
        await asyncio.wait_for(waiting(ticket), 10)
    assert caught.value.status == 503 and caught.value.retry_after_seconds == 2
    assert queues.depth(model.uid) == 0 and queues.swap_in_running(model.uid)
    assert recorder.refusals == ["QueueTimeout"] and recorder.waits == ["timeout"]
    directory.release(model.uid)
    await until_on_loop(lambda: directory.completed[model.uid] == 1, "the swap-in to complete")
    assert queues.enter(model) is None and directory.swap_ins[model.uid] == 1


@pytest.mark.asyncio
async def test_a_timer_firing_before_the_deadline_does_not_let_a_waiter_through() -> None:
    # uvloop starts timers from its cached millisecond clock, so a wait may end a little
    # before the clock reads the deadline: the waiter must wait on, not return as released.
    readings = iter(index * 0.02 for index in range(1_000))
    model = route("llama", queue_timeout_seconds=0.05)
    directory = FakeDirectory([model])
    directory.hold(model.uid)
    queues = SwapInQueues(directory, retry_after_seconds=2, now=lambda: next(readings))
    ticket = queues.enter(model)
    assert ticket is not None
    with pytest.raises(QueueTimeoutError):
        await asyncio.wait_for(waiting(ticket), 10)
    assert queues.swap_in_running(model.uid)
    directory.release(model.uid)
    await until_on_loop(lambda: directory.completed[model.uid] == 1, "the swap-in to complete")


@pytest.mark.asyncio
async def test_ticks_let_a_waiter_report_progress() -> None:
    model = route("llama", queue_timeout_seconds=None)
    directory = FakeDirectory([model])
    directory.hold(model.uid)
    queues, _ = queues_for(directory)
    ticket = queues.enter(model)
    assert ticket is not None
    assert await ticket.wait(0.001) is False
    directory.release(model.uid)
    assert await asyncio.wait_for(ticket.wait(), 10) is True
    ticket.close()


@pytest.mark.asyncio
async def test_a_failed_swap_in_fails_every_waiter_and_the_next_request_retries() -> None:
    model = route("llama")
    directory = FakeDirectory([model])
    directory.hold(model.uid)
    directory.failure[model.uid] = refuse("no room on the GPU")
    queues, recorder = queues_for(directory)
    tickets = [queues.enter(model) for _ in range(3)]
    directory.release(model.uid)
    results = await asyncio.gather(*(waiting(t) for t in tickets), return_exceptions=True)
    assert all(isinstance(r, SwapInFailedError) for r in results)
    assert [r.retry_after_seconds for r in results if isinstance(r, SwapInFailedError)] == [7] * 3
    assert recorder.refusals == ["SwapInFailed"] * 3

    directory.failure[model.uid] = RuntimeError("engine exploded")
    with pytest.raises(
        SwapInFailedError, match="could not be swapped in: engine exploded"
    ) as caught:
        await waiting(queues.enter(model))
    assert caught.value.retry_after_seconds == 2
    del directory.failure[model.uid]
    await waiting(queues.enter(model))
    assert directory.swap_ins[model.uid] == 3 and queues.depths() == []


@pytest.mark.asyncio
async def test_a_cancelled_waiter_frees_its_place() -> None:
    model = route("llama", max_queued=1)
    directory = FakeDirectory([model])
    directory.hold(model.uid)
    queues, recorder = queues_for(directory)
    entered = asyncio.Event()

    async def client() -> None:
        ticket = queues.enter(model)
        entered.set()
        await waiting(ticket)

    task = asyncio.create_task(client())
    await asyncio.wait_for(entered.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert queues.depth(model.uid) == 0 and recorder.waits == ["cancelled"]
    replacement = queues.enter(model)  # the place is free again
    directory.release(model.uid)
    await asyncio.wait_for(waiting(replacement), 10)
    assert directory.swap_ins[model.uid] == 1


@pytest.mark.asyncio
async def test_close_cancels_running_swap_ins() -> None:
    model = route("llama")
    directory = FakeDirectory([model])
    directory.hold(model.uid)
    queues, _ = queues_for(directory)
    ticket = queues.enter(model)
    await queues.close()
    with pytest.raises(SwapInFailedError, match="shutting down"):
        await asyncio.wait_for(waiting(ticket), 10)
    assert queues.depths() == []


@pytest.mark.asyncio
async def test_a_directory_error_reaches_the_waiters_as_it_is() -> None:
    model = route("llama")
    directory = FakeDirectory([model])
    directory.failure[model.uid] = UnknownModelError("model llama is no longer served on this node")
    queues, recorder = queues_for(directory)
    with pytest.raises(UnknownModelError, match="no longer served"):
        await asyncio.wait_for(waiting(queues.enter(model)), 10)
    assert recorder.refusals == ["ModelNotFound"]
