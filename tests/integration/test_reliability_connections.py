"""A flood of idle connections against the real agent (issue 26, item 2): with its
open-files limit at 1,024, 1,200 idle TCP connections to the gateway (from eight loopback
addresses), 200 to the control API and 100 to the metrics server, all held open.

Before the caps this took every fd the agent had: probes went unanswered and the engine
could not accept a model process (at 4,096 fds and 4,200 connections, 0 of 9 probes were
served, an engine write failed with "Too many open files", and a model stayed broken for
minutes after the connections went). Now each server closes its longest-idle connections
to admit new ones, and the gateway's cap leaves a reserve: during the flood every probe
and the control API and metrics answer, a model already loaded answers right, a new model
loads (its process attaches to the engine through the agent's socket) and answers right,
and the agent holds fewer fds than its limit; after the flood its fds come back down and
everything answers. The row goes to the `faults` section of docs/RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelswap_sidecar.triton.process import free_loopback_port
from tests.support import agent_harness
from tests.support.agent_harness import MIB, AgentConfig, entry, eventually, new_uid, node
from tests.support.bursts import (
    Expected,
    Outcomes,
    Reference,
    one_request,
    raise_open_files,
    small_mlp_models,
    usage,
)
from tests.support.reliability import record

#: The agent's open-files limit, soft and hard (it raises its soft limit to the hard one).
AGENT_OPEN_FILES = 1024
GATEWAY_FLOOD = 1200  # more connections than the agent may hold files
CONTROL_FLOOD = 200
METRICS_FLOOD = 100
FLOOD_ADDRESSES = tuple(f"127.0.0.{i}" for i in range(2, 10))
PROBES = 9
WEIGHTS_BYTES = 2 * MIB
ANSWER_TIMEOUT_SECONDS = 10.0

_LIMITED = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, ({n}, {n})); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


@contextlib.contextmanager
def agent_open_files(limit: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The agent `node()` starts runs under an open-files limit of `limit` (soft and
    hard): its command is exec'd by a Python that lowered the limit first."""
    spawn = agent_harness.spawn

    def limited(command: list[str], log_path: Path, env: dict[str, str] | None = None) -> Any:
        if "sidecar" in command:
            command = [sys.executable, "-c", _LIMITED.format(n=limit), *command]
        return spawn(command, log_path, env)

    monkeypatch.setattr(agent_harness, "spawn", limited)
    yield


class Flood:
    """Idle TCP connections held open until `close`."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []

    async def open(self, port: int, n: int, addresses: tuple[str, ...]) -> None:
        for i in range(n):
            _, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(addresses[i % len(addresses)], 0)
            )
            self.writers.append(writer)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
        self.writers.clear()


async def probes(url: str) -> int:
    """How many of `PROBES` new connections asking `/v2/health/ready` got a 200."""
    served = 0
    for _ in range(PROBES):
        async with httpx.AsyncClient(trust_env=False, timeout=ANSWER_TIMEOUT_SECONDS) as http:
            try:
                if (await http.get(f"{url}/v2/health/ready")).status_code == 200:
                    served += 1
            except httpx.HTTPError:
                pass
    return served


async def answers(url: str, reference: Reference, models: list[Expected]) -> Outcomes:
    """One inference per model, each on a new connection, checked against the reference."""
    outcomes = Outcomes()
    for seed, model in enumerate(models):
        async with httpx.AsyncClient(base_url=url, trust_env=False) as http:
            await one_request(
                http, reference, model, seed, outcomes, timeout_seconds=ANSWER_TIMEOUT_SECONDS
            )
    return outcomes


def metric(text: str, name: str, labels: str = "") -> float | None:
    """The sum of `name`'s samples whose labels hold `labels`; None when it has none."""
    found = None
    for line in text.splitlines():
        if (line.startswith(name + " ") or line.startswith(name + "{")) and labels in line:
            found = (found or 0.0) + float(line.rsplit(" ", 1)[1])
    return found


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.timeout(600)
async def test_an_idle_connection_flood_leaves_probes_the_engine_and_models_answering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raise_open_files(4 * (GATEWAY_FLOOD + CONTROL_FLOOD + METRICS_FLOOD))
    gateway_port = free_loopback_port()
    config = AgentConfig(
        gpu_bytes=(4 * WEIGHTS_BYTES,),
        extra={
            "gateway": {"host": "127.0.0.1", "port": gateway_port},
            "modelRoots": {"/models": str(small_mlp_models(tmp_path, WEIGHTS_BYTES))},
        },
    )
    reference = Reference()
    checksum = reference.checksum(WEIGHTS_BYTES)
    first, second = Expected("m0", checksum), Expected("m1", checksum)
    uids = [new_uid(), new_uid()]
    entries = [
        entry(uid, name=name, weights="2Mi") for uid, name in zip(uids, ("m0", "m1"), strict=True)
    ]
    gateway = f"http://127.0.0.1:{gateway_port}"
    flood = Flood()
    with agent_open_files(AGENT_OPEN_FILES, monkeypatch):
        async with node(tmp_path, config) as n, httpx.AsyncClient(trust_env=False) as scrape:
            _triton, agent, control, _models = n.parts()
            metrics_url = f"http://127.0.0.1:{agent.metrics_port}/metrics"
            try:
                await control.desired(entries[:1])
                await control.wait_state(uids[0], "Resident", timeout_seconds=120)
                assert (await answers(gateway, reference, [first])).ok == 1
                baseline = usage(agent.pid)
                cap = metric(
                    (await scrape.get(metrics_url)).text,
                    "modelswap_gateway_max_connections",
                    'limit="max_connections"',
                )

                await flood.open(gateway_port, GATEWAY_FLOOD, FLOOD_ADDRESSES)
                await flood.open(agent.control_port, CONTROL_FLOOD, FLOOD_ADDRESSES)
                await flood.open(agent.metrics_port, METRICS_FLOOD, FLOOD_ADDRESSES)
                during = await probes(gateway)
                flooded = await answers(gateway, reference, [first])
                # a new model: Triton loads it and its process attaches to the engine
                attach_began = time.monotonic()
                await control.desired(entries)
                await control.wait_state(uids[1], "Resident", timeout_seconds=120)
                attached_seconds = time.monotonic() - attach_began
                flooded_both = await answers(gateway, reference, [first, second])
                listed = len(await control.models())
                text = (await scrape.get(metrics_url)).text
                peak_fds = usage(agent.pid).fds

                released = time.monotonic()
                flood.close()

                async def recovered() -> bool:
                    if usage(agent.pid).fds > baseline.fds + 32:
                        return False
                    done = await answers(gateway, reference, [first, second])
                    return done.ok == 2

                await eventually(recovered, timeout_seconds=60, what="fds back, models answer")
                recovery_seconds = time.monotonic() - released
                after = await probes(gateway)
            finally:
                flood.close()
            closed_idle = metric(text, "modelswap_gateway_connections_closed_idle_total") or 0
            refused = metric(text, "modelswap_gateway_connections_refused_total") or 0
            record(
                "faults",
                target=(
                    f"{GATEWAY_FLOOD:,} idle connections to the gateway, {CONTROL_FLOOD} to the "
                    f"control API, {METRICS_FLOOD} to metrics; agent open-files limit "
                    f"{AGENT_OPEN_FILES:,} (gateway cap {cap and int(cap)})"
                ),
                moment="held open while probes, inference and a new model's attach ran",
                outcome=(
                    f"{during}/{PROBES} probes served during, {after}/{PROBES} after; a new "
                    f"model attached and answered in {attached_seconds:.1f} s; agent fds "
                    f"peaked at {peak_fds} of {AGENT_OPEN_FILES:,}; {int(closed_idle)} idle "
                    f"connections closed to admit new ones, {int(refused)} refused"
                ),
                recovery_seconds=round(recovery_seconds, 2),
                answers_checked=flooded.requests + flooded_both.requests,
                wrong=len(flooded.wrong) + len(flooded_both.wrong),
                lost_bytes=0,
            )
            assert during == PROBES, during
            assert flooded.ok == 1, (flooded.wrong, flooded.hung)
            assert flooded_both.ok == 2, (flooded_both.wrong, flooded_both.hung)
            assert listed == 2
            assert peak_fds < AGENT_OPEN_FILES - 128, peak_fds
            assert after == PROBES, after
            assert cap is not None and cap < AGENT_OPEN_FILES
            assert closed_idle >= GATEWAY_FLOOD - cap
