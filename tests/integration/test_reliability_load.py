"""Load in phases (issue 12, deliverable 3): ten models on a sim GPU with room for three
(the real agent with its gateway, real Triton on CPU), each phase making a known set of
models cold and then hitting its models with a burst from 1,000 concurrent clients.

The swap-ins each phase must cause are computed before it runs (`plan_phases`, pure); the
test then checks every answer against `examples/models/reference.py`, that no request hung
(each answered, or refused 429/503 with `Retry-After`, within its timeout), that the
agent's `/metrics` counted exactly the planned swap-ins per model, and that the agent's
memory, open fds and threads stay flat from phase to phase. Figures go to the `load`
section of docs/RELIABILITY.md (`tests/support/reliability.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.policy import effective_policy
from modelswap_sidecar.triton.process import free_loopback_port
from tests.support.agent_harness import (
    MIB,
    AgentConfig,
    Control,
    entry,
    eventually,
    new_uid,
    node,
)
from tests.support.bursts import (
    Expected,
    Outcomes,
    Reference,
    burst,
    one_request,
    raise_open_files,
    small_mlp_models,
    usage,
)
from tests.support.reliability import record
from tests.support.waiting import until

MODELS = 10
ROOM = 3
#: Small regions keep each answer's CRC-32 (of the whole region) cheap on two cores.
WEIGHTS_BYTES = 2 * MIB
CLIENTS = 1000
REQUESTS_PER_CLIENT = 1
REQUEST_TIMEOUT_SECONDS = 60.0


# -- the plan (pure) -----------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    name: str
    cold_by_hand: tuple[int, ...]  # swapped out through the control API before the burst
    hit: tuple[int, ...]  # the models the burst calls


@dataclass(frozen=True)
class Planned:
    phase: Phase
    resident_before: frozenset[int]  # after the swap-outs by hand
    swap_ins: frozenset[int]
    resident_after: frozenset[int]
    evicting: int  # how many of the swap-ins need a victim (the GPU is full)


PHASES = (
    Phase("cold start", (), (0, 1, 2)),
    Phase("warm", (), (0, 1, 2)),
    Phase("all evicted", (), (3, 4, 5)),
    Phase("one cold by hand", (4,), (3, 4, 5)),
    Phase("two evicted", (), (5, 6, 7)),
    Phase("rotate", (), (8, 9, 0)),
    Phase("two cold by hand", (8, 9), (8, 9, 1)),
)


def plan_phases(phases: Sequence[Phase], room: int) -> list[Planned]:
    """Which models each phase swaps in, from all models swapped out at the start.

    A phase's models all fit (at most `room`), and the models they displace are every
    resident model outside the phase, so which ones go never depends on the policy's
    tie-breaks: the plan refuses a phase that would leave a choice. (The run calls each
    resident model a phase hits once before its burst: the first cold request may come
    before any for those, and the least recently used must be the ones outside.)"""
    resident: frozenset[int] = frozenset()
    planned = []
    for phase in phases:
        hit = frozenset(phase.hit)
        assert len(hit) <= room, phase
        before = resident - frozenset(phase.cold_by_hand)
        swap_ins = hit - before
        need_out = max(len(before) + len(swap_ins) - room, 0)
        others = before - hit
        assert need_out in (0, len(others)), f"{phase.name}: the victims would be a choice"
        after = hit | (others if need_out == 0 else frozenset())
        planned.append(Planned(phase, before, swap_ins, after, need_out))
        resident = after
    return planned


def test_the_plan_swaps_in_what_each_phase_finds_cold() -> None:
    plan = plan_phases(PHASES, ROOM)
    assert [len(p.swap_ins) for p in plan] == [3, 0, 3, 1, 2, 3, 3]
    assert [p.evicting for p in plan] == [0, 0, 3, 0, 2, 3, 1]
    assert plan[-1].resident_after == {8, 9, 1}
    with pytest.raises(AssertionError, match="a choice"):
        plan_phases([Phase("a", (), (0, 1, 2)), Phase("b", (), (3,))], ROOM)


# -- the run ---------------------------------------------------------------------------------


def load_entry(uid: str, name: str) -> dict[str, Any]:
    """An mlp that only pressure swaps out, with a queue that holds a burst's share."""
    wire = entry(
        uid,
        name=name,
        weights=f"{WEIGHTS_BYTES // MIB}Mi",
        swap_policy={"idleAfter": "never", "minResident": "1s", "onSwapOut": "host"},
    )
    wire["spec"]["gateway"] = {"maxQueued": CLIENTS, "queueTimeout": "30s"}
    wire["policy"] = effective_policy(wire["spec"], BUILTIN_DEFAULTS).to_status().to_dict()
    return wire


def swap_ins_by_uid(metrics_text: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "modelswap_swap_ins_total":
                uid = sample.labels.get("uid", "")
                counts[uid] = counts.get(uid, 0.0) + sample.value
    return counts


async def resident_uids(control: Control) -> set[str]:
    return {uid for uid, m in (await control.models()).items() if m.get("state") == "Resident"}


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.timeout(900)
async def test_phased_bursts_swap_in_as_planned_with_every_answer_right(tmp_path: Path) -> None:
    raise_open_files(4 * CLIENTS + 1024)  # the agent (started below) inherits it
    gateway_port = free_loopback_port()
    config = AgentConfig(
        gpu_bytes=(ROOM * WEIGHTS_BYTES,),
        extra={
            "gateway": {"host": "127.0.0.1", "port": gateway_port},
            "modelRoots": {"/models": str(small_mlp_models(tmp_path, WEIGHTS_BYTES))},
            # Room for three means three: no watermark swaps models out below a full GPU.
            "policy": {
                "intervalSeconds": 0.25,
                "retryFailedSeconds": 60,
                "drainTimeoutSeconds": 20,
                "highWatermarkFraction": 1.0,
                "lowWatermarkFraction": 1.0,
            },
        },
    )
    plan = plan_phases(PHASES, ROOM)
    reference = Reference()
    names = [f"m{i}" for i in range(MODELS)]
    uids = [new_uid() for _ in range(MODELS)]
    expected = [Expected(name, reference.checksum(WEIGHTS_BYTES)) for name in names]
    async with (
        node(tmp_path, config) as n,
        httpx.AsyncClient(trust_env=False, timeout=10) as metrics,
    ):
        _triton, agent, control, _models = n.parts()
        metrics_url = f"http://127.0.0.1:{agent.metrics_port}/metrics"
        await control.desired([load_entry(u, name) for u, name in zip(uids, names, strict=True)])

        async def all_loaded() -> bool:
            states = [m.get("state") for m in (await control.models()).values()]
            return len(states) == MODELS and all(s in ("Resident", "SwappedOut") for s in states)

        await eventually(all_loaded, timeout_seconds=300, what="all ten models loaded")
        for uid in await resident_uids(control):  # the plan starts with every model cold
            assert (await control.swap(uid, "out")).json()["outcome"] == "completed"

        flat_baseline = None
        for number, planned in enumerate(plan, 1):
            phase = planned.phase
            for i in phase.cold_by_hand:
                out = await control.swap(uids[i], "out")
                assert out.json()["outcome"] == "completed", out.text
            assert await resident_uids(control) == {uids[i] for i in planned.resident_before}
            before = swap_ins_by_uid((await metrics.get(metrics_url)).text)
            await _use_once(
                f"http://127.0.0.1:{gateway_port}",
                reference,
                [expected[i] for i in phase.hit if i in planned.resident_before],
            )

            result = await burst(
                f"http://127.0.0.1:{gateway_port}",
                reference,
                [expected[i] for i in phase.hit],
                clients=CLIENTS,
                requests_per_client=REQUESTS_PER_CLIENT,
                timeout_seconds=REQUEST_TIMEOUT_SECONDS,
            )
            outcomes = result.outcomes

            after = swap_ins_by_uid((await metrics.get(metrics_url)).text)
            seen = {i for i in range(MODELS) if after.get(uids[i], 0) > before.get(uids[i], 0)}
            swap_ins_seen = sum(after.values()) - sum(before.values())
            # The agent's connections from the burst close; then what it holds is read.
            now = await until(
                lambda b=flat_baseline: _settled(agent.pid, b),  # type: ignore[misc]
                "connections closed",
            )
            record(
                "load",
                phase=f"{number}. {phase.name}",
                models=len(phase.hit),
                cold=len(planned.swap_ins),
                clients=CLIENTS,
                requests=outcomes.requests,
                throughput_rps=round(result.throughput_rps, 1),
                p50_seconds=round(outcomes.percentile_seconds(50), 4),
                p99_seconds=round(outcomes.percentile_seconds(99), 4),
                refusals=outcomes.refused,
                refusal_reasons=outcomes.refusal_reasons,
                wrong=len(outcomes.wrong),
                hung=len(outcomes.hung),
                swap_ins_expected=len(planned.swap_ins),
                swap_ins_seen=int(swap_ins_seen),
                rss_bytes=now.rss_bytes,
                fds=now.fds,
                threads=now.threads,
            )
            assert outcomes.wrong == [], outcomes.wrong[:5]
            assert outcomes.hung == [], outcomes.hung[:5]
            assert outcomes.requests == CLIENTS * REQUESTS_PER_CLIENT
            assert outcomes.ok > 0
            assert seen == set(planned.swap_ins), (phase.name, seen)
            assert swap_ins_seen == len(planned.swap_ins), (phase.name, swap_ins_seen)
            assert await resident_uids(control) == {uids[i] for i in planned.resident_after}
            if flat_baseline is None:  # the first burst warms the agent's pools up
                flat_baseline = now
            else:
                assert now.fds <= flat_baseline.fds + 16, (phase.name, now, flat_baseline)
                assert now.threads <= flat_baseline.threads + 8, (phase.name, now, flat_baseline)
                assert now.rss_bytes <= flat_baseline.rss_bytes * 1.25 + 32 * MIB, (
                    phase.name,
                    now,
                    flat_baseline,
                )


async def _use_once(gateway_url: str, reference: Reference, models: list[Expected]) -> None:
    """One right answer from each of `models` (all resident): they become the most
    recently used, as the plan assumes."""
    outcomes = Outcomes()
    async with httpx.AsyncClient(base_url=gateway_url, trust_env=False) as http:
        for model in models:
            await one_request(http, reference, model, 0, outcomes, timeout_seconds=30)
    assert outcomes.ok == len(models), (outcomes.wrong, outcomes.hung, outcomes.refused)


def _settled(pid: int, baseline: Any) -> Any:
    """The agent's usage once its fds are back near the baseline (or after the first phase,
    once fewer than one per client remain open)."""
    now = usage(pid)
    limit = CLIENTS // 10 if baseline is None else baseline.fds + 16
    return now if now.fds <= limit else None
