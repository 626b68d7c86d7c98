"""Faults at moments the tests do not choose (issue 12, deliverable 4).

The node: `modelswap node` with the real agent (and its gateway) and the real Triton, three
models. A seeded `random.Random` picks what to kill -9 (the agent or Triton; in a test of
its own, one model's stub process) and when, while clients keep calling every model
through the gateway. Every 200 is checked against `examples/models/reference.py` under the model's own name; the time
from each kill until every model answers correctly again is recorded; after each recovery
the agent's accounting is exact (each model resident with exactly its size, none lost);
after the stop nothing is left running and no shm region remains. Rows go to the `faults`
section of docs/RELIABILITY.md.

The operator: two `modelswap operator` processes (leader and standby) against the API
emulator answering 409/429/500 or timing out at seeded random, the follower and then the
leader killed -9: all Ready again, nothing moved, each model served by one node. And a node
Lease left to go stale (its renewals failed by the emulator) while its agent still serves:
the model moves, and once the Lease renews the old agent lets go of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from kubernetes.client.rest import ApiException

from modelswap_sidecar.triton.process import free_loopback_port, shm_regions
from tests.support.agent_harness import MIB, AgentConfig, Node, entry, eventually, new_uid
from tests.support.bursts import Expected, Reference, processes_mentioning, small_mlp_models
from tests.support.kube_emulator.faults import FaultRates
from tests.support.kube_testing import REPO_ROOT, load_yaml
from tests.support.node_supervised import SupervisedNode
from tests.support.operator_processes import OperatorProcess
from tests.support.operator_world import Objects, agents, emulator
from tests.support.reliability import record
from tests.support.waiting import until, until_async

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]
T = TypeVar("T")
EXAMPLES = REPO_ROOT / "examples" / "toy"

SEED = 20261123
KILLS = 6
MODELS = 3
WEIGHTS_BYTES = 2 * MIB
REQUEST_TIMEOUT_SECONDS = 30.0
RECOVERY_LIMIT_SECONDS = 120.0


# -- clients that keep calling ------------------------------------------------------------------


@dataclass
class Tally:
    """Every outcome of the clients' requests, with the wrong ones kept for the report."""

    ok: int = 0
    refused: int = 0  # 429/503 with Retry-After
    unavailable: int = 0  # no gateway to connect to (the agent is down), or no answer
    not_found: int = 0  # 404 for a model that exists (issue 12, finding 10)
    other: dict[int, int] = field(default_factory=dict)  # non-200s the gateway should not give
    wrong: list[str] = field(default_factory=list)  # 200s with a wrong answer

    @property
    def checked(self) -> int:
        return self.ok + len(self.wrong)


async def call(
    http: httpx.AsyncClient, reference: Reference, model: Expected, seed: int, tally: Tally
) -> bool:
    """One request; True when it was answered correctly."""
    try:
        r = await http.post(f"/v2/models/{model.name}/infer", json=reference.bodies[seed])
    except httpx.HTTPError:
        tally.unavailable += 1
        return False
    if r.status_code == 200:
        problem = reference.problem(seed, model, r.json())
        if problem is None:
            tally.ok += 1
            return True
        tally.wrong.append(f"{model.name}: {problem}")
    elif r.status_code in (429, 503) and r.headers.get("Retry-After", "").isdigit():
        tally.refused += 1
    elif r.status_code == 404:
        tally.not_found += 1
    else:
        tally.other[r.status_code] = tally.other.get(r.status_code, 0) + 1
    return False


@contextlib.asynccontextmanager
async def clients_calling(
    url: str, reference: Reference, models: list[Expected], tally: Tally, per_model: int = 2
) -> AsyncIterator[None]:
    stop = asyncio.Event()

    async def loop(i: int) -> None:
        model = models[i % len(models)]
        async with httpx.AsyncClient(
            base_url=url, trust_env=False, timeout=REQUEST_TIMEOUT_SECONDS
        ) as http:
            n = 0
            while not stop.is_set():
                if not await call(http, reference, model, (i + n) % 16, tally):
                    await asyncio.sleep(0.05)  # a refused client backs off a little
                n += 1

    tasks = [asyncio.create_task(loop(i)) for i in range(per_model * len(models))]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks)


# -- the node -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def supervised_node() -> AsyncIterator[tuple[SupervisedNode, int]]:
    # A short folder: the agent's Unix socket path must stay under 108 bytes.
    folder = Path(tempfile.mkdtemp(prefix="ms-rel-"))
    gateway_port = free_loopback_port()
    config = AgentConfig(
        retry_failed_seconds=5.0,
        extra={
            "gateway": {"host": "127.0.0.1", "port": gateway_port},
            "modelRoots": {"/models": str(small_mlp_models(folder, WEIGHTS_BYTES))},
        },
    )
    node = SupervisedNode(folder, config)
    try:
        yield node, gateway_port
    except BaseException:
        print(node.tail())
        raise
    finally:
        await node.close()
        shutil.rmtree(folder, ignore_errors=True)


async def all_answer(url: str, reference: Reference, models: list[Expected]) -> bool:
    probe = Tally()
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=5.0) as http:
        answers = [await call(http, reference, m, 0, probe) for m in models]
    return all(answers)


async def accounting(node: SupervisedNode, uids: list[str]) -> tuple[int, list[str]]:
    """Bytes missing from what the agent reports (each model resident with exactly its
    size) and the problems found."""
    held = await node.control.models()
    lost, problems = 0, []
    for uid in uids:
        model = held.get(uid)
        if model is None:
            lost += WEIGHTS_BYTES
            problems.append(f"{uid} is gone")
            continue
        if model.get("state") != "Resident" or model.get("residentBytes") != WEIGHTS_BYTES:
            problems.append(f"{uid}: {model.get('state')}, {model.get('residentBytes')} resident")
        if model.get("hostBytes") != WEIGHTS_BYTES:
            problems.append(f"{uid}: {model.get('hostBytes')} host-store bytes")
    return lost, problems


def kill(node: SupervisedNode, target: str, uid: str) -> int:
    if target == "agent":
        pid = int(node.child("agent")["pid"])
        os.killpg(pid, signal.SIGKILL)
    elif target == "triton":
        pid = int(node.child("runtime")["pid"])
        os.kill(pid, signal.SIGKILL)
    else:
        pid = node.stub_pids(uid)[0]
        os.kill(pid, signal.SIGKILL)
    return pid


async def kill_run(targets: tuple[str, ...], kills: int, recovery_limit_seconds: float) -> None:
    """`kills` kill -9s of seeded random `targets` at seeded random moments under load."""
    rng = random.Random(SEED)
    reference = Reference()
    names = [f"r{i}" for i in range(MODELS)]
    uids = [new_uid() for _ in names]
    models = [Expected(name, reference.checksum(WEIGHTS_BYTES)) for name in names]
    never = {"idleAfter": "never", "onSwapOut": "host"}
    async with supervised_node() as (node, gateway_port):
        folder = str(node.dir)
        url = f"http://127.0.0.1:{gateway_port}"
        await node.start()
        await node.control.desired(
            [
                entry(uid, name=name, weights=f"{WEIGHTS_BYTES // MIB}Mi", swap_policy=never)
                for uid, name in zip(uids, names, strict=True)
            ]
        )
        for uid in uids:
            await node.control.wait_state(uid, "Resident", timeout_seconds=120)
        await until_async(lambda: all_answer(url, reference, models), "every model answers", 60,
                          poll_seconds=0.1)  # fmt: skip

        tally = Tally()
        began = time.monotonic()
        async with clients_calling(url, reference, models, tally):
            for _ in range(kills):
                await asyncio.sleep(rng.uniform(0.5, 4.0))  # the moment: not the test's choice
                target = rng.choice(targets)
                victim = rng.randrange(MODELS)
                before = Tally(**{**tally.__dict__, "other": dict(tally.other),
                                  "wrong": list(tally.wrong)})  # fmt: skip
                moment = time.monotonic() - began
                killed = time.monotonic()
                kill(node, target, uids[victim])
                row = {
                    "target": f"kill -9 {target}"
                    + (f" ({names[victim]})" if target == "model process" else ""),
                    "moment": f"{moment:.1f} s into the run (seed {SEED})",
                }
                try:
                    await until_async(
                        lambda: all_answer(url, reference, models),
                        f"every model to answer after the {target} was killed",
                        recovery_limit_seconds,
                        poll_seconds=0.1,
                    )
                except AssertionError:
                    lost, problems = await accounting(node, uids)
                    record("faults", **row,
                           outcome=f"NOT RECOVERED in {recovery_limit_seconds:.0f} s: "
                           + "; ".join(problems),
                           recovery_seconds=None, answers_checked=tally.checked - before.checked,
                           wrong=len(tally.wrong) - len(before.wrong), lost_bytes=lost)  # fmt: skip
                    raise
                recovery = time.monotonic() - killed
                await until_async(lambda: _accounted(node, uids), "the agent's accounting", 60,
                                  poll_seconds=0.1)  # fmt: skip
                lost, problems = await accounting(node, uids)
                record("faults", **row, outcome=_outcome(before, tally),
                       recovery_seconds=round(recovery, 2),
                       answers_checked=tally.checked - before.checked,
                       wrong=len(tally.wrong) - len(before.wrong), lost_bytes=lost)  # fmt: skip
                assert problems == [], problems
                assert lost == 0
                # A request in flight when Triton dies is refused 503 UpstreamUnavailable
                # with Retry-After (it was a 502 without one: issue 12, found by this suite).
        assert tally.wrong == [], tally.wrong[:5]
        assert tally.ok > 0
        # Besides right answers: refusals with Retry-After and no gateway while the agent
        # is down, each counted in its row's outcome; never another status.
        assert tally.other == {}, tally.other

        # Stopped as the kubelet stops it: nothing left running, no shm region.
        assert node.stop() == 0, node.tail()
        await until_async(lambda: _nothing_left(folder, node.shm_prefix), "nothing left", 30,
                          poll_seconds=0.1)  # fmt: skip


@pytest.mark.timeout(900)
async def test_seeded_random_kills_of_agent_and_triton_lose_nothing_and_recover() -> None:
    await kill_run(("agent", "triton"), KILLS, RECOVERY_LIMIT_SECONDS)


@pytest.mark.timeout(300)
async def test_a_model_process_killed_at_random_is_reloaded_and_loses_nothing() -> None:
    await kill_run(("model process",), 1, 60.0)


def _outcome(before: Tally, after: Tally) -> str:
    parts = ["recovered, every answer right" if len(after.wrong) == len(before.wrong)
             else "WRONG ANSWERS"]  # fmt: skip
    if after.unavailable > before.unavailable:
        parts.append(f"{after.unavailable - before.unavailable} requests found no gateway")
    if after.refused > before.refused:
        parts.append(f"{after.refused - before.refused} refused with Retry-After")
    if after.not_found > before.not_found:
        parts.append(f"{after.not_found - before.not_found} 404 (finding 10)")
    for code, n in sorted(after.other.items()):
        if n > before.other.get(code, 0):
            parts.append(f"{n - before.other.get(code, 0)} answered {code}")
    return "; ".join(parts)


async def _accounted(node: SupervisedNode, uids: list[str]) -> bool:
    lost, problems = await accounting(node, uids)
    return lost == 0 and not problems


async def _nothing_left(folder: str, shm_prefix: str) -> bool:
    return not processes_mentioning(folder) and not shm_regions(shm_prefix)


# -- the operator ---------------------------------------------------------------------------------

API_FAULTS = FaultRates(
    conflict=0.03, throttle=0.03, internal=0.03, timeout=0.01, seed=SEED, timeout_seconds=3.0
)
OPERATOR_MODELS = ("c0", "c1", "c2")
KUBE_REFUSALS = (409, 429, 500, 504)


def patient(fn: Callable[[], T]) -> T:
    """The test's own API calls retried through the injected faults (not what is tested)."""
    for _ in range(100):
        try:
            return fn()
        except ApiException as e:
            if e.status not in KUBE_REFUSALS:
                raise
        time.sleep(0.05)
    raise AssertionError("100 API calls in a row failed")


def placements(
    objects: Objects, names: tuple[str, ...] = OPERATOR_MODELS
) -> dict[str, tuple[str, str]] | None:
    """uid → (name, node) once every model is Ready, else None."""
    found = {}
    for name in names:
        obj = patient(lambda n=name: objects.get(n))  # type: ignore[misc]
        if obj is None:
            return None
        ready = patient(lambda n=name: objects.condition(n, "Ready"))  # type: ignore[misc]
        if ready.get("status") != "True":
            return None
        # the object was read before its condition: it may predate the status that says Ready
        node = obj.get("status", {}).get("node")
        if not node:
            return None
        found[obj["metadata"]["uid"]] = (name, node)
    return found


def operator_model(name: str) -> dict[str, Any]:
    """The classify example, kept resident (an idle swap-out would make Ready flicker)."""
    body = load_yaml(EXAMPLES / "classify-drop-on-idle.yaml")
    body["metadata"]["name"] = name
    body["spec"]["swapPolicy"] = {"idleAfter": "never", "onSwapOut": "host"}
    return body


async def held_by(nodes: dict[str, Node]) -> dict[str, set[str]]:
    """uid → the nodes whose agent serves it (desired there, or still resident)."""
    holders: dict[str, set[str]] = {}
    for name, running in nodes.items():
        for uid, model in (await running.control.models()).items():
            if model.get("desired") or model.get("state") == "Resident":
                holders.setdefault(uid, set()).add(name)
    return holders


async def converged(objects: Objects, nodes: dict[str, Node]) -> dict[str, tuple[str, str]]:
    """Every model Ready on one node, held there and nowhere else, its status saying so."""

    async def probe() -> dict[str, tuple[str, str]] | None:
        placed = await asyncio.to_thread(placements, objects)
        if placed is None:
            return None
        holders = await held_by(nodes)
        for uid, (_name, node_name) in placed.items():
            if holders.get(uid) != {node_name}:
                return None
        return placed

    found: dict[str, tuple[str, str]] = await eventually(
        probe, timeout_seconds=120, what="every model Ready on exactly one node"
    )
    return found


@pytest.mark.timeout(600)
async def test_operator_converges_through_api_faults_and_leader_and_follower_kills(
    tmp_path: Path,
) -> None:
    with emulator() as api:
        emulated = api.emulator
        assert emulated is not None
        objects = Objects(api)
        async with agents(api, tmp_path, names=("node-a", "node-b")) as nodes:
            pair = [OperatorProcess(api, tmp_path, f"op-{i}") for i in range(2)]
            for process in pair:
                process.start()
            # As the kubelet would: an operator that exits (it does when it loses the
            # leader Lease, e.g. to a renewal the API server held past the lease) or is
            # killed is started again.
            keeper = asyncio.create_task(restarting(pair))
            try:
                await until(lambda: leader_of(pair) is not None, "one operator leads")

                # From here on the API server fails requests at seeded random.
                api.call(lambda: emulated.inject(API_FAULTS))
                began = time.monotonic()
                for name in OPERATOR_MODELS:
                    body = operator_model(name)
                    patient(lambda b=body: objects.apply(b))  # type: ignore[misc]
                first = await converged(objects, nodes)
                record("faults", target="API server: 409/429/500/504 at 3/3/3/1 %",
                       moment=f"from the first apply (seed {SEED})",
                       outcome="all Ready, each on one node",
                       recovery_seconds=round(time.monotonic() - began, 2),
                       answers_checked=0, wrong=0, lost_bytes=0)  # fmt: skip

                for role in ("follower", "leader"):
                    leader = await until(lambda: leader_of(pair), "a leader")
                    victim = (
                        leader if role == "leader" else next(p for p in pair if p is not leader)
                    )
                    await until(lambda v=victim: v.readyz() in (200, 503), f"{victim.name} up")  # type: ignore[misc]
                    victim.kill9()
                    killed = time.monotonic()
                    await until(lambda: leader_of(pair) is not None, "a leader again", 60)
                    after = await converged(objects, nodes)
                    record("faults", target=f"kill -9 operator {role}",
                           moment="under the API faults, all models Ready",
                           outcome="all Ready, none moved, each on one node"
                           if after == first else "all Ready, each on one node (some moved)",
                           recovery_seconds=round(time.monotonic() - killed, 2),
                           answers_checked=0, wrong=0, lost_bytes=0)  # fmt: skip
                    # Nothing moves for a lost operator. A node's own Lease can lapse under
                    # the injected 3 s timeouts (its grace here is 3 s, 90 s in the chart):
                    # a model may then move, but only off a node the operator found stale.
                    left = {first[uid][1] for uid in first if after.get(uid) != first[uid]}
                    logs = "".join(p.log() for p in pair)
                    stale = {n for n in left if f"SwapNode {n}: its node's Lease is stale" in logs}
                    assert left == stale, (first, after)

                failed = [r for r in api.request_log() if r.fault]
                assert failed, "no request was failed: the faults were not injected"
            finally:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
                for process in pair:
                    process.stop()
        objects.close()


def leader_of(pair: list[OperatorProcess]) -> OperatorProcess | None:
    return next((p for p in pair if p.readyz() == 200), None)


async def restarting(pair: list[OperatorProcess]) -> None:
    while True:
        for process in pair:
            if process.popen is not None and process.popen.poll() is not None:
                process.start()
        await asyncio.sleep(0.5)


@pytest.mark.timeout(400)
async def test_a_stale_node_lease_moves_its_model_and_the_old_agent_lets_go(
    tmp_path: Path,
) -> None:
    with emulator() as api:
        emulated = api.emulator
        assert emulated is not None
        objects = Objects(api)
        async with agents(api, tmp_path, names=("node-a", "node-b")) as nodes:
            op = OperatorProcess(api, tmp_path, "op-0")
            try:
                op.start()
                await until(lambda: op.readyz() == 200, "the operator leads")
                patient(lambda: objects.apply(operator_model("c0")))
                (uid, (_name, stale)), *_ = (await converged_one(objects, nodes)).items()

                # The Lease of the model's node stops renewing; its agent serves on.
                api.call(
                    lambda: emulated.inject(FaultRates(internal=1.0, paths=(f"/leases/{stale}",)))
                )
                went_stale = time.monotonic()

                async def moved() -> bool:
                    placed = await asyncio.to_thread(placements, objects, ("c0",))
                    return placed is not None and placed[uid][1] != stale

                await eventually(moved, timeout_seconds=60, what="the model to move")
                moved_seconds = time.monotonic() - went_stale
                still = (await nodes[stale].control.models()).get(uid, {})
                api.call(lambda: emulated.inject(None))  # the Lease renews again
                final = await converged_one(objects, nodes)
                record("faults", target=f"node Lease of {stale} stale while its agent serves",
                       moment="the model Ready, its node healthy",
                       outcome=f"moved in {moved_seconds:.1f} s; the old agent "
                       f"{'still served it' if still.get('state') == 'Resident' else 'had let go'}"
                       " until its Lease renewed, then let go; served by one node",
                       recovery_seconds=round(time.monotonic() - went_stale, 2),
                       answers_checked=0, wrong=0, lost_bytes=0)  # fmt: skip
                assert final[uid][1] != stale
                assert any(r.fault for r in api.request_log())
            finally:
                code = op.stop()
        assert code in (0, None), op.log()[-2000:]
        objects.close()


async def converged_one(objects: Objects, nodes: dict[str, Node]) -> dict[str, tuple[str, str]]:
    async def probe() -> dict[str, tuple[str, str]] | None:
        placed = await asyncio.to_thread(placements, objects, ("c0",))
        if placed is None:
            return None
        holders = await held_by(nodes)
        ok = all(holders.get(uid) == {node} for uid, (_n, node) in placed.items())
        return placed if ok else None

    found: dict[str, tuple[str, str]] = await eventually(
        probe, timeout_seconds=120, what="c0 Ready and served by one node"
    )
    return found
