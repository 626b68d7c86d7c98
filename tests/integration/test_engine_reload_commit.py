"""A dropped model reloading its weights is swapped out while its request holds it
(issue 26, item 4), with real processes: the agent and a model process through the client
library. The request (`hold`: inside `in_use()`) loaded the weights and commits them while
the swap-out's drain waits for that very request. Before the fix the commit waited for the
model's operation lock, which the swap-out held through its drain, until the drain timed
out (60 s in the product, 30 s here); now the commit answers at once and the swap-out
gives way once the request ends.

The order is forced, not raced: the commit is sent only once the agent reports the model
Draining, and the drain cannot end while the request holds `in_use()`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engine_procs import Background, Procs, shm_procs
from tests.support.waiting import wait_for

MIB = 1 << 20
REGIONS = [["w", 4 * MIB, "weights"], ["kv", 2 * MIB, "kv"]]
#: What a commit beside a drain may take (its stall was the whole drain timeout).
PROMPT_SECONDS = 10.0
DRAIN_TIMEOUT_SECONDS = 30.0


@pytest.fixture
def procs() -> Iterator[Procs]:
    with shm_procs("modelswap-commit-drain-") as p:
        yield p


def state_of(status: dict[str, Any], model: str) -> str:
    return str(status["models"][model]["state"])


def test_a_reload_committing_under_a_drain_answers_at_once_and_is_not_dropped(
    procs: Procs,
) -> None:
    agent = procs.agent(
        ["64M"], ["classify:0:discard:drop"], ["--drain-timeout", str(DRAIN_TIMEOUT_SECONDS)]
    )
    c = procs.client(agent, "classify")
    assert not c.ok(cmd="attach", model="classify", socket=agent.socket, regions=REGIONS)[
        "restored"
    ]
    c.ok(cmd="fill", tag="w", seed=1)
    c.ok(cmd="commit")
    agent.ok(cmd="swap_out", model="classify")
    assert state_of(agent.status(), "classify") == "Dropped"

    # a request comes: its in_use() swaps the model in (fresh memory) and loads the weights
    assert c.ok(cmd="hold")["held"]
    assert state_of(agent.status(), "classify") == "Loading"
    digest = str(c.ok(cmd="fill", tag="w", seed=2)["sha256"])

    out = Background(agent.call, cmd="swap_out", model="classify")
    wait_for(lambda: state_of(agent.status(), "classify") == "Draining", 10, "the swap-out's drain")
    saved = Background(c.call, cmd="commit")  # from the request that holds the drain
    saved.join(PROMPT_SECONDS)
    assert saved.error is None and saved.result["ok"], saved.result
    assert out.is_alive()  # the drain still waits for the request

    c.ok(cmd="release")  # the request ends
    refused = out.join(PROMPT_SECONDS)
    assert refused["ok"] is False and refused["code"] == "WrongState", refused
    assert "committed its weights" in refused["error"]

    status = agent.status()
    assert state_of(status, "classify") == "Resident"
    assert status["gpus"][0]["budget_used_bytes"] == 6 * MIB
    state = c.ok(cmd="state")
    assert state["state"] == "resident" and state["committed"] is True
    assert c.ok(cmd="hash", tag="w")["sha256"] == digest  # served as loaded, no reload
    # idle now, it is an ordinary victim again: dropped at once
    agent.ok(cmd="swap_out", model="classify")
    assert state_of(agent.status(), "classify") == "Dropped"
