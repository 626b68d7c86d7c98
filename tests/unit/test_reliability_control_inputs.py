"""Hostile bodies to the agent's control API, served as the agent serves it (`start`): a
compressed body (a bomb, sent before any token is checked), a body or headers trickled
slowly, a large desired set. Each is answered (or the connection closed) within its limit,
naming it, and the API keeps answering other callers meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from modelswap_api.control import MAX_ENTRIES
from modelswap_sidecar.control.app import make_app, start
from modelswap_sidecar.control.auth import TokenFile
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings
from tests.support.memory_backend import InMemoryBackend
from tests.support.reliability import record
from tests.support.waiting import until_on_loop
from tests.unit.test_control_api import AUTH, desired, entry
from tests.unit.test_control_desired_file import GRACE_SECONDS, CountingWriter, Node
from tests.unit.test_reliability_gateway_bodies import bomb

pytestmark = pytest.mark.timeout(120)


@dataclass
class Served:
    url: str
    port: int
    service: ControlService


@contextlib.asynccontextmanager
async def served(tmp_path: Path, **settings: Any) -> AsyncIterator[Served]:
    token_file = tmp_path / "token"
    token_file.write_text(AUTH["Authorization"].removeprefix("Bearer ") + "\n")
    control = ControlSettings(
        node_name="node-1",
        token_file=token_file,
        state_file=tmp_path / "revision.json",
        host="127.0.0.1",
        port=0,
        unload_check_interval_seconds=3600,
        **settings,
    )
    backend = InMemoryBackend("node-1", {"gpu-0": 1 << 40})
    service = ControlService(backend, control, clock=time.time)
    runner = await start(make_app(service, TokenFile(token_file)))
    try:
        port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        yield Served(f"http://127.0.0.1:{port}", port, service)
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def node_info_probe(url: str) -> AsyncIterator[list[float]]:
    """GET /v1/node every 20 ms while the block runs; yields the latencies after the first
    (each a 200)."""
    latencies: list[float] = []
    answered = asyncio.Event()

    async def probe() -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                started = time.monotonic()
                async with http.get(url + "/v1/node", headers=AUTH) as r:
                    assert r.status == 200, await r.text()
                latencies.append(time.monotonic() - started)
                if len(latencies) >= 2:
                    answered.set()
                await asyncio.sleep(0.02)

    task = asyncio.create_task(probe())
    try:
        await asyncio.wait_for(answered.wait(), 10)
        # the first answer pays for the connection and the first call: warm-up, not the
        # loop held, so it is not yielded
        del latencies[0]
        yield latencies
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.asyncio
@pytest.mark.parametrize("token", [False, True], ids=["no-token", "token"])
async def test_a_compressed_body_is_never_inflated(tmp_path: Path, token: bool) -> None:
    """aiohttp inflated request bodies as they arrived, before the token was checked: an
    anonymous 260 KB gzip body held the agent's event loop for half a second."""
    body = bomb("gzip", 256 << 20)
    async with served(tmp_path) as s, node_info_probe(s.url) as latencies:
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
        if token:
            headers.update(AUTH)
        started = time.monotonic()
        async with aiohttp.request("PUT", s.url + "/v1/desired", data=body, headers=headers) as r:
            answer = await r.json()
        seconds = time.monotonic() - started
    assert (r.status, answer["reason"]) == (
        (415, "UnsupportedMediaType") if token else (401, "Unauthorized")
    ), answer
    assert seconds < 3.0  # no hang; the probe below catches a held event loop
    assert max(latencies) < 0.25, latencies
    record(
        "inputs",
        input=f"control API: PUT /v1/desired gzip bomb ({len(body)} bytes -> 256 MiB), "
        f"{'with' if token else 'without'} a token",
        limit="no Content-Encoding accepted; the body is never inflated",
        outcome=f"{r.status} {answer['reason']}; GET /v1/node slowest meanwhile "
        f"{max(latencies):.3f} s",
        answered_seconds=round(seconds, 3),
    )


@pytest.mark.asyncio
async def test_a_trickled_body_is_a_408_and_trickled_headers_lose_the_connection(
    tmp_path: Path,
) -> None:
    settings = {"body_timeout_seconds": 0.5, "idle_timeout_seconds": 0.5}
    async with served(tmp_path, **settings) as s, node_info_probe(s.url) as latencies:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        writer.write(
            b"PUT /v1/desired HTTP/1.1\r\nHost: agent\r\n"
            + f"Authorization: {AUTH['Authorization']}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        )
        started = time.monotonic()
        status_line = await asyncio.wait_for(reader.readline(), 5)
        body_seconds = time.monotonic() - started
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        started = time.monotonic()
        writer.write(b"GET /v1/node HTTP/1.1\r\nHost: agent\r\n")  # and never the rest
        leftover = await asyncio.wait_for(reader.read(), 5)
        header_seconds = time.monotonic() - started
        writer.close()
    assert b" 408 " in status_line, status_line
    assert 0.4 < body_seconds < 3.0
    assert leftover == b"" and 0.4 < header_seconds < 3.0
    assert max(latencies) < 0.25, latencies
    record(
        "inputs",
        input="control API: a body that stops after one byte (slowloris)",
        limit="ControlSettings.body_timeout_seconds (0.5 s in this test; 30 s default)",
        outcome="408 RequestTimeout",
        answered_seconds=round(body_seconds, 3),
    )
    record(
        "inputs",
        input="control API: request headers that never finish (slowloris)",
        limit="ControlSettings.idle_timeout_seconds (0.5 s in this test; 75 s default)",
        outcome="connection closed",
        answered_seconds=round(header_seconds, 3),
    )


@pytest.mark.asyncio
async def test_a_declared_length_over_the_limit_is_a_413_before_the_body_is_read(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        started = time.monotonic()
        writer.write(
            b"PUT /v1/desired HTTP/1.1\r\nHost: agent\r\n"
            + f"Authorization: {AUTH['Authorization']}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{"
        )
        status_line = await asyncio.wait_for(reader.readline(), 5)
        seconds = time.monotonic() - started
        writer.close()
    assert b" 413 " in status_line, status_line
    assert seconds < 3.0  # no hang; the probe below catches a held event loop
    record(
        "inputs",
        input="control API: Content-Length 10,000,000,000 (one byte sent)",
        limit="ControlSettings.max_body_bytes (16 MiB)",
        outcome="413 before the body is read",
        answered_seconds=round(seconds, 3),
    )


@pytest.mark.asyncio
@pytest.mark.slow
async def test_checking_a_large_desired_set_leaves_the_event_loop_to_others(
    tmp_path: Path,
) -> None:
    """Schema and CEL checks of each entry took the event loop (~10-30 ms an entry) that
    the gateway and the other routes share: they now run in a thread."""
    entries = [entry(f"00000000-0000-4000-8000-{n:012x}", weights=f"{n + 1}Mi") for n in range(150)]
    body = json.dumps(desired(1, 1, *entries))
    async with served(tmp_path) as s, node_info_probe(s.url) as latencies:
        started = time.monotonic()
        async with aiohttp.request(
            "PUT", s.url + "/v1/desired", data=body, headers=AUTH, timeout=None
        ) as r:
            answer = await r.json()
        seconds = time.monotonic() - started
        during = list(latencies)
    assert r.status == 200, answer
    assert len(answer["results"]) == 150
    assert len(during) >= 3 and max(during) < 0.5, during
    record(
        "inputs",
        input="control API: a desired set of 150 distinct entries (schema and CEL each)",
        limit="MAX_ENTRIES 4,096; checked in a thread, not the event loop",
        outcome=f"200 in {seconds:.2f} s; GET /v1/node slowest meanwhile {max(during):.3f} s",
        answered_seconds=round(seconds, 3),
    )


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("revision", "generation", "field"),
    [
        ({"term": 2**63, "counter": 0}, 1, "revision.term"),
        ({"term": 1, "counter": 2**64}, 1, "revision.counter"),
        ({"term": 1, "counter": 1}, 2**70, "entries[0].generation"),
    ],
    ids=["term-2^63", "counter-2^64", "generation-2^70"],
)
async def test_a_revision_or_generation_past_its_bound_is_refused_and_the_node_takes_the_next(
    tmp_path: Path, revision: dict[str, int], generation: int, field: str
) -> None:
    """Issue 26, item 8: these were taken and stored, and every later push was refused as
    older (the node stuck). Now a 400 naming the field; the next ordinary push is taken."""
    uid = "00000000-0000-4000-8000-00000000000a"
    body = {"revision": revision, "entries": [entry(uid, generation=generation)]}
    value = max([*revision.values(), generation])
    async with served(tmp_path) as s, aiohttp.ClientSession(headers=AUTH) as http:
        started = time.monotonic()
        async with http.put(s.url + "/v1/desired", json=body) as r:
            answer = await r.json()
        seconds = time.monotonic() - started
        assert (r.status, answer["field"]) == (400, field), answer
        async with http.put(s.url + "/v1/desired", json=desired(1, 0, entry(uid))) as r:
            assert r.status == 200, await r.text()
        assert s.service.revision is not None and s.service.revision.term == 1
    record(
        "inputs",
        input=f"control API: PUT /v1/desired with {field} = {value}",
        limit="term and counter <= 2^53-1, generation <= 2^63-1; never stored",
        outcome=f"400 naming {field}; the next push (term 1) taken",
        answered_seconds=round(seconds, 4),
    )


@pytest.mark.asyncio
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_desired_set_shrinking_from_4096_to_10_writes_the_file_once(
    tmp_path: Path,
) -> None:
    """Issue 26, item 8: 4,096 entries shrinking to 10 rewrote the 7 MB desired.json on
    each of 4,086 unloads with the control lock held (PUT and DELETE timed out). The real
    agent backend (stand-in engine): one write for the batch, a DELETE answered during it."""
    writer = CountingWriter()
    node = Node(tmp_path, MAX_ENTRIES, writer)
    try:
        await node.push(node.entries)
        await node.push(node.entries[:10])
        file_bytes = node.desired_file.stat().st_size
        before = writer.writes
        node.clock.now_seconds += GRACE_SECONDS
        started = time.monotonic()
        unloading = asyncio.create_task(node.service.unload_due())
        await until_on_loop(lambda: len(node.loader.unloaded) >= 100, "unloads to start", 60.0)
        asked = time.monotonic()
        answer = await asyncio.wait_for(node.service.delete(node.entries[-1].uid), 30.0)
        delete_seconds = time.monotonic() - asked
        assert not unloading.done()  # answered during the batch, not after it
        unloaded = await asyncio.wait_for(unloading, 300.0)
        seconds = time.monotonic() - started
    finally:
        await node.close()
    assert answer.reason == "Forgotten"
    assert len(unloaded) == MAX_ENTRIES - 11  # the batch skipped the one deleted meanwhile
    batch_writes = writer.writes - before
    assert batch_writes <= 2, writer.sizes[before:]  # the batch's, and the DELETE's
    assert node.saved_uids() == {e.uid for e in node.entries[:10]}
    record(
        "inputs",
        input=f"control API: a desired set of {MAX_ENTRIES} entries shrinking to 10 "
        f"(desired.json {file_bytes / 1e6:.1f} MB), unloaded after the grace period",
        limit="desired.json saved once per change, written outside the control lock; "
        "the lock taken per unload",
        outcome=f"{len(unloaded)} unloads in {seconds:.1f} s, {batch_writes} file writes "
        f"(was one per unload); a DELETE meanwhile answered in {delete_seconds:.3f} s",
        answered_seconds=round(delete_seconds, 4),
    )
