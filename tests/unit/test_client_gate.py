"""The client's state gate alone: `in_use()` entry, the swap-out drain and what cancels it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from modelswap_api.wire import ErrorCode
from modelswap_client._gate import ClientState, StateGate
from modelswap_client.errors import ClientError
from tests.support.waiting import wait_for

S = ClientState
DEADLINE_SECONDS = 10.0


def deadline(seconds: float = DEADLINE_SECONDS) -> float:
    return time.monotonic() + seconds


def no_swap_in(_deadline: float) -> None:
    raise AssertionError("not swapped out: nobody should ask for a swap-in")


def in_thread(target: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run `target()` on a thread; its result or exception lands in the list."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(target())
        except Exception as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_resident_model_lets_callers_in_and_out() -> None:
    gate = StateGate("m")
    assert gate.state is S.DETACHED
    gate.set(S.RESIDENT)
    gate.enter(deadline(), no_swap_in)
    gate.enter(deadline(), no_swap_in)
    gate.leave()
    gate.leave()
    assert gate.state is S.RESIDENT and not gate.ended


def test_a_swapped_out_model_is_swapped_in_first_without_the_lock_held() -> None:
    gate = StateGate("m")
    gate.set(S.SWAPPED_OUT)
    asked: list[float] = []

    def swap_in(d: float) -> None:
        asked.append(d)
        # the agent's MAP/RESTORE arrive on another thread while the caller waits here
        t, _ = in_thread(lambda: gate.set(S.RESIDENT))
        t.join(DEADLINE_SECONDS)

    when = deadline()
    gate.enter(when, swap_in)
    assert asked == [when]
    gate.leave()


def test_a_removed_model_refuses_callers_and_ends() -> None:
    gate = StateGate("m")
    gate.set(S.REMOVED)
    with pytest.raises(ClientError) as e:
        gate.enter(deadline(), no_swap_in)
    assert e.value.code is ErrorCode.REMOVED
    assert gate.ended


def test_close_ends_the_gate() -> None:
    gate = StateGate("m")
    gate.set(S.RESIDENT)
    gate.close()
    assert gate.ended


def test_a_caller_times_out_while_the_model_is_not_resident() -> None:
    gate = StateGate("m")
    gate.set(S.MAPPED)
    with pytest.raises(TimeoutError):
        gate.enter(deadline(0.05), no_swap_in)


def test_a_drain_waits_for_callers_and_keeps_new_ones_out_until_resumed() -> None:
    gate = StateGate("m")
    gate.set(S.RESIDENT)
    gate.enter(deadline(), no_swap_in)
    drainer, drained = in_thread(gate.drain)
    wait_for(lambda: gate.state is S.DRAINING, DEADLINE_SECONDS, "draining")
    assert drained == []  # one caller still inside
    gate.leave()
    drainer.join(DEADLINE_SECONDS)
    (token,) = drained
    gate.quiesced(token)
    assert gate.state is S.QUIESCED
    with pytest.raises(TimeoutError):  # quiesced: nobody enters
        gate.enter(deadline(0.05), no_swap_in)
    gate.resume()
    assert gate.state is S.RESIDENT
    gate.enter(deadline(), no_swap_in)
    gate.leave()


def test_only_a_resident_model_can_be_drained() -> None:
    gate = StateGate("m")
    gate.set(S.SWAPPED_OUT)
    with pytest.raises(ClientError) as e:
        gate.drain()
    assert e.value.code is ErrorCode.WRONG_STATE


@pytest.mark.parametrize("cancel", ["connection_lost", "resume"])
def test_a_lost_agent_or_a_resume_cancels_a_drain(cancel: str) -> None:
    gate = StateGate("m")
    gate.set(S.RESIDENT)
    gate.enter(deadline(), no_swap_in)
    drainer, drained = in_thread(gate.drain)
    wait_for(lambda: gate.state is S.DRAINING, DEADLINE_SECONDS, "draining")
    getattr(gate, cancel)()
    drainer.join(DEADLINE_SECONDS)
    (error,) = drained
    assert isinstance(error, ClientError) and error.code is ErrorCode.STALE
    gate.leave()
