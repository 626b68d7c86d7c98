"""The agent's swap records against a real engine (sim allocator, client processes): every
swap, whoever asked for it, is counted once where it happens, with its real duration; the
policy is fed the requests in flight and each GPU's measured link.

The actuator runs in-process over a real `Engine` and its protocol server; the models are
attached by `tests.support.engine_client` processes (Triton is not needed: the actuator's
records are made LOADED by hand, as a finished load leaves them).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from modelswap_api.control import DesiredEntry
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import Link, ModelDeploymentSpec
from modelswap_api.policy import effective_policy
from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.ports import reports
from modelswap_sidecar.agent.ports.gateway_directory import AgentDirectory
from modelswap_sidecar.allocators.sim import SimAllocator
from modelswap_sidecar.engine.core import Engine, EngineSettings
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import ModelConfig
from modelswap_sidecar.engine.server import EngineServer
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.vouching import RegisteredVoucher
from modelswap_sidecar.metrics import NodeMetrics
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.facade import Policy
from modelswap_sidecar.policy.inputs import PolicySettings
from modelswap_sidecar.triton.naming import triton_model_name
from tests.support.engine_procs import ClientProc, Procs, shm_procs

pytestmark = pytest.mark.asyncio

MIB = 1 << 20
UIDS = [f"00000000-0000-4000-8000-{n:012x}" for n in range(1, 4)]
GPU = "sim-gpu-0"


@pytest.fixture
def procs() -> Iterator[Procs]:
    with shm_procs("modelswap-records-") as p:
        yield p


class World:
    def __init__(self, procs: Procs, budget_mib: int, links: tuple[Link, ...]) -> None:
        self.procs = procs
        self.voucher = RegisteredVoucher()
        self.allocator = SimAllocator(
            capacities_bytes=[budget_mib * MIB], pool_chunk_bytes=32 * MIB
        )
        store = HostStore(procs.workdir / "store", {0: 256 * MIB})
        self.engine = Engine(
            self.allocator,
            store,
            self.voucher,
            EngineSettings(),
            decider=lambda name: self.actuator.decide_client_swap_in(name),  # noqa: PLW0108 - built below
        )
        self.socket = procs.workdir / "agent.sock"
        self.server = EngineServer(self.engine, self.socket)
        self.server.start()
        self.registry = CollectorRegistry()
        self.actuator = Actuator(
            engine=self.engine,
            loader=cast(Any, None),  # nothing here loads through Triton
            policy=Policy(PolicySettings(), time.monotonic),  # the actuator's clock
            gpu_uuids=(GPU,),
            metrics=None,
            links=links,
        )
        self.actuator.metrics = NodeMetrics(
            self.registry,
            lambda: reports.node_sample(self.engine, list(self.actuator.records.values()), (GPU,)),
        )
        self.clients: dict[str, ClientProc] = {}

    def close(self) -> None:
        self.server.close()
        self.engine.close()
        self.allocator.close()

    def model(self, uid: str, weights_mib: int, swap_policy: dict[str, Any]) -> AgentModel:
        """A model served and resident, as a finished load leaves it: its engine record,
        its client attached and committed, its agent record LOADED."""
        spec = {
            "model": {"source": {"uri": "/m"}, "weightsBytes": f"{weights_mib}Mi"},
            "swapPolicy": swap_policy,
        }
        policy = effective_policy(spec, BUILTIN_DEFAULTS)
        entry = DesiredEntry(
            uid=uid,
            namespace="ns",
            name=uid[-4:],
            generation=1,
            spec=ModelDeploymentSpec.from_dict(spec),
            policy=policy.to_status(),
        )
        name = triton_model_name(uid)
        self.engine.add_model(ModelConfig(name, 0))
        client = self.clients[uid] = self.procs.client(cast(Any, None), name, vouch=False)
        self.voucher.register(client.pid, name)
        regions = [["w", weights_mib * MIB, "weights"]]
        client.ok(cmd="attach", model=name, socket=str(self.socket), regions=regions)
        client.ok(cmd="fill", tag="w", seed=1)
        client.ok(cmd="commit")
        model = AgentModel(entry=entry, policy=policy, serving=Serving.LOADED, gpu=0)
        model.resident_since_seconds = self.actuator.clock()
        self.actuator.records[uid] = model
        return model

    def metric(self, name: str, uid: str, **labels: str) -> float:
        model = self.actuator.records[uid]
        value = self.registry.get_sample_value(
            name, {"uid": uid, "namespace": "ns", "model": model.entry.name, **labels}
        )
        return value or 0.0

    def swap_outs_in_metrics(self, uid: str) -> float:
        return sum(
            s.value
            for metric in self.registry.collect()
            if metric.name == "modelswap_swap_outs"
            for s in metric.samples
            if s.name == "modelswap_swap_outs_total" and s.labels.get("uid") == uid
        )


@pytest_asyncio.fixture
async def world_factory(procs: Procs) -> AsyncIterator[Any]:
    made: list[World] = []

    def make(budget_mib: int, links: tuple[Link, ...] = ()) -> World:
        w = World(procs, budget_mib, links)
        w.actuator.listen(asyncio.get_running_loop())
        made.append(w)
        return w

    yield make
    for w in made:
        await w.actuator.close()
        w.close()


@pytest.mark.timeout(300)
async def test_metrics_count_every_swap_once_with_real_durations(world_factory: Any) -> None:
    """100 random swaps: manual swap-outs and swap-ins through the actuator (victims made
    room by the policy), and clients' own swap-ins (the engine makes room itself). Every
    one is counted once, in the record and in /metrics, as the engine counted it."""
    w: World = world_factory(20)  # room for two of the three 8 MiB models
    loose = {"idleAfter": "never", "minResident": "0s"}
    for uid in UIDS:  # each placed after room is made for it, as the agent's placement does
        if len(w.actuator.records) == 2:
            await w.actuator.swap_out(w.actuator.records[UIDS[0]], reason="Manual")
        w.model(uid, 8, loose)
    rng = random.Random(11)
    for _ in range(100):
        uid = rng.choice(UIDS)
        how = rng.random()
        if how < 0.4:
            await w.actuator.swap_out(w.actuator.records[uid], reason="Manual")
        elif how < 0.8:
            await w.actuator.swap_in(w.actuator.records[uid])
        else:  # the client's own swap-in (its in_use()), evicting on the engine's side
            await asyncio.to_thread(w.clients[uid].ok, cmd="hash", tag="w")
    await asyncio.sleep(0)  # events handed over by the last engine call
    total_in = total_out = 0
    for uid in UIDS:
        status = w.engine.status(triton_model_name(uid))
        model = w.actuator.records[uid]
        assert (model.swap_ins, model.swap_outs) == (status.swap_ins, status.swap_outs)
        assert w.metric("modelswap_swap_ins_total", uid) == status.swap_ins
        assert w.swap_outs_in_metrics(uid) == status.swap_outs
        count = w.metric("modelswap_swap_in_duration_seconds_count", uid)
        assert count == status.swap_ins
        if status.swap_ins:  # real durations, not zeros backfilled
            assert w.metric("modelswap_swap_in_duration_seconds_sum", uid) > 0
        if status.swap_outs:
            assert w.metric("modelswap_swap_out_duration_seconds_sum", uid) > 0
        total_in += status.swap_ins
        total_out += status.swap_outs
    assert total_in > 10 and total_out > 10


async def test_a_victim_with_a_request_in_flight_is_spared(world_factory: Any) -> None:
    """Two resident models fill the GPU; the third's swap-in needs one of them out. The
    policy would take the idler one, but a gateway request is in flight on it: the other
    goes, and the busy one keeps serving."""
    w: World = world_factory(20)
    loose = {"idleAfter": "never", "minResident": "0s"}
    cold = w.model(UIDS[2], 8, loose)
    await w.actuator.swap_out(cold, reason="Manual")
    busy, other = (w.model(uid, 8, loose) for uid in UIDS[:2])
    now = w.actuator.clock()
    busy.resident_since_seconds = other.resident_since_seconds = now - 200.0
    busy.last_request_seconds = now - 100.0  # the idlest: the victim, were it not busy
    other.last_request_seconds = now - 1.0
    directory = AgentDirectory(w.actuator)
    directory.request_started(busy.uid)
    view = w.actuator.view()
    assert view.model(busy.uid).active_requests == 1
    admission = w.actuator.policy.admit(view, cold.uid)
    assert [v.uid for v in admission.victims] == [other.uid]
    result = await w.actuator.swap_in(cold)
    assert result.outcome == "completed", result
    assert busy.resident_since_seconds is not None and busy.swap_outs == 0
    assert other.swap_outs == 1
    directory.request_finished(busy.uid)
    assert busy.active_requests == 0
    # once answered, the idlest one is the victim again
    cold.last_request_seconds = w.actuator.clock()  # it just served the request
    await w.actuator.swap_out(other, reason="Manual")
    assert [v.uid for v in w.actuator.policy.admit(w.actuator.view(), other.uid).victims] == [
        busy.uid
    ]


async def test_a_swap_in_waits_for_a_busy_model_to_become_idle(world_factory: Any) -> None:
    """Both resident models are serving a request when the third is asked for. Rather than
    drain one (the first by uid), the swap-in waits; the model whose request ends first is
    swapped out, and the gateway's request_finished wakes the waiting swap-in."""
    w: World = world_factory(20)
    loose = {"idleAfter": "never", "minResident": "0s"}
    cold = w.model(UIDS[2], 8, loose)
    await w.actuator.swap_out(cold, reason="Manual")
    first, second = (w.model(uid, 8, loose) for uid in UIDS[:2])
    directory = AgentDirectory(w.actuator)
    directory.request_started(first.uid)
    directory.request_started(second.uid)
    assert w.actuator.policy.admit(w.actuator.view(), cold.uid, waited_seconds=0.0).reason == (
        "WaitingForIdle"
    )
    swap_in = asyncio.create_task(w.actuator.swap_in(cold))
    for _ in range(10):  # let it ask and start waiting (no thread is involved until admitted)
        await asyncio.sleep(0)
    assert not swap_in.done()
    assert first.swap_outs == second.swap_outs == 0
    directory.request_finished(second.uid)
    result = await asyncio.wait_for(swap_in, 10)
    assert result.outcome == "completed", result
    assert (first.swap_outs, second.swap_outs) == (0, 1)
    assert first.resident_since_seconds is not None
    directory.request_finished(first.uid)


@pytest.mark.parametrize(
    ("gbps", "victim"),
    [
        # fast link: bringing either back is cheap, the bytes freed decide (the big one)
        (400.0, 0),
        # slow link: the cost grows with the bytes, the idle time decides (the small one)
        (0.001, 1),
    ],
)
async def test_scoring_uses_the_measured_link(world_factory: Any, gbps: float, victim: int) -> None:
    w: World = world_factory(20, (Link(kind="pcie", host_to_device_gbps=gbps),))
    loose = {"idleAfter": "never", "minResident": "0s"}
    cold = w.model(UIDS[2], 8, loose)
    await w.actuator.swap_out(cold, reason="Manual")
    big = w.model(UIDS[0], 12, loose)
    small = w.model(UIDS[1], 4, loose)
    assert w.actuator.view().gpu(GPU).host_to_device_bytes_per_second == gbps * 1e9
    now = w.actuator.clock()
    big.resident_since_seconds = small.resident_since_seconds = now - 30.0
    big.last_request_seconds = now - 10.0
    small.last_request_seconds = now - 20.0
    admission = w.actuator.policy.admit(w.actuator.view(), cold.uid)
    assert [v.uid for v in admission.victims] == [(big, small)[victim].uid]


async def test_an_unmeasured_link_scores_with_the_default() -> None:
    from modelswap_sidecar.agent.core.actuator import (
        UNMEASURED_LINK_BYTES_PER_SECOND,
        link_bytes_per_second,
    )

    assert link_bytes_per_second(None) == UNMEASURED_LINK_BYTES_PER_SECOND
    assert link_bytes_per_second(Link()) == UNMEASURED_LINK_BYTES_PER_SECOND
    assert link_bytes_per_second(Link(kind="c2c", host_to_device_gbps=350.0)) == 350e9


async def test_a_client_swap_in_the_policy_refuses_is_refused(world_factory: Any) -> None:
    """A client's own swap-in (its `in_use()` on a swapped-out model) is decided by the
    agent's policy like any other: with a pinned model holding the room it needs, the
    client is refused with the policy's reason, and nothing is swapped."""
    w: World = world_factory(20)
    cold = w.model(UIDS[0], 16, {"idleAfter": "never", "minResident": "0s"})
    await w.actuator.swap_out(cold, reason="Manual")
    pinned = w.model(UIDS[1], 12, {"idleAfter": "never", "minResident": "0s", "pinned": True})
    answer = await asyncio.to_thread(w.clients[cold.uid].call, cmd="hash", tag="w")
    assert answer["ok"] is False, answer
    assert "NoRoom" in answer["error"] and "pinned" in answer["error"], answer
    assert w.engine.status(cold.triton_name).state is EngineState.SWAPPED_OUT
    assert (cold.swap_ins, pinned.swap_outs) == (0, 0)
    # with room made (the pinned model unpinned and idle), the same request is admitted
    await asyncio.to_thread(w.engine.remove_model, pinned.triton_name)
    del w.actuator.records[pinned.uid]
    answer = await asyncio.to_thread(w.clients[cold.uid].call, cmd="hash", tag="w")
    assert answer["ok"] is True, answer
    assert cold.swap_ins == 1


async def test_cold_models_swapped_in_at_once_each_get_room(world_factory: Any) -> None:
    """One model resident, room for one more, two cold models asked for at the same moment
    (a burst reaching two cold models): both must be admitted against what the other takes —
    the second makes room by swapping the resident one out — and neither is refused."""
    w: World = world_factory(20)  # room for two of the three 8 MiB models
    loose = {"idleAfter": "never", "minResident": "0s"}
    for uid in UIDS:
        if len(w.actuator.records) == 2:
            await w.actuator.swap_out(w.actuator.records[UIDS[0]], reason="Manual")
        w.model(uid, 8, loose)
    resident, *cold = (w.actuator.records[uid] for uid in UIDS)
    await w.actuator.swap_in(resident)
    for model in cold:
        await w.actuator.swap_out(model, reason="Manual")
    results = await asyncio.gather(*(w.actuator.swap_in(model) for model in cold))
    assert [r.outcome for r in results] == ["completed", "completed"], results
    states = {uid: w.engine.status(triton_model_name(uid)).state for uid in UIDS}
    assert states == {
        UIDS[0]: EngineState.SWAPPED_OUT,
        UIDS[1]: EngineState.RESIDENT,
        UIDS[2]: EngineState.RESIDENT,
    }
