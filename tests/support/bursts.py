"""Many concurrent clients against the gateway, every answer checked, and what the agent's
process holds (/proc): the figures the reliability suite's load and fault tests record.

A burst is `clients` asyncio tasks over one httpx client with that many connections; each
task sends its requests one after another and classifies every outcome:

- `ok`: 200 and the answer the reference computes (`examples/models/reference.py`), under
  the model's own name;
- `refused`: 429 or 503 with a `Retry-After` (the gateway's documented refusals);
- `wrong`: any other answer (a wrong tensor, a wrong model, a 5xx, a refusal without
  `Retry-After`), kept with its detail;
- `hung`: no answer within the request's timeout, or the connection lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import ssl
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from examples.models.reference import mlp_checksum, mlp_forward, mlp_infer_body, mlp_input

INPUT_SEEDS = 16
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"


def small_mlp_models(folder: Path, weights_bytes: int) -> Path:
    """A copy of examples/models whose mlp accepts a region of `weights_bytes` (its own
    minimum is 32 MiB): each answer's CRC-32 of the whole region stays cheap on two cores."""
    root = folder / "models"
    shutil.copytree(EXAMPLES / "mlp", root / "mlp", ignore=shutil.ignore_patterns("__pycache__"))
    config = root / "mlp" / "config.pbtxt"
    text = config.read_text()
    if '"33554432"' not in text:
        raise AssertionError("examples/models/mlp no longer states min_weights_bytes 33554432")
    config.write_text(text.replace('"33554432"', f'"{weights_bytes}"'))
    return root


@dataclass(frozen=True)
class Expected:
    """What one mlp model must answer: its user name and its region's CRC-32."""

    name: str
    checksum: int


class Reference:
    """Inputs and their expected outputs, computed once (independent of the models' code)."""

    def __init__(self) -> None:
        self.inputs = [mlp_input(seed, rows=1) for seed in range(INPUT_SEEDS)]
        self.bodies = [mlp_infer_body(x) for x in self.inputs]
        self.outputs = [mlp_forward(x) for x in self.inputs]

    @staticmethod
    def checksum(weights_bytes: int) -> int:
        return mlp_checksum(weights_bytes)

    def problem(self, seed: int, expected: Expected, body: dict[str, object]) -> str | None:
        """None when `body` is the right answer for input `seed` from `expected`."""
        if body.get("model_name") != expected.name:
            return f"answered as {body.get('model_name')!r}, not {expected.name!r}"
        outputs = {o["name"]: o for o in body.get("outputs", [])}  # type: ignore[attr-defined]
        try:
            got = np.array(outputs["OUTPUT0"]["data"], dtype=np.float64).reshape(1, -1)
            checksum = int(outputs["CHECKSUM"]["data"][0])
        except (KeyError, ValueError, IndexError) as e:
            return f"malformed answer: {e!r}"
        if not np.allclose(got, self.outputs[seed], rtol=1e-4, atol=1e-4):
            return f"OUTPUT0 {got.tolist()} != {self.outputs[seed].tolist()}"
        if checksum != expected.checksum:
            return f"CHECKSUM {checksum} != {expected.checksum} (bytes lost or another model)"
        return None


@dataclass
class Outcomes:
    ok: int = 0
    refused: int = 0
    wrong: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    latencies_seconds: list[float] = field(default_factory=list)
    refusal_reasons: dict[str, int] = field(default_factory=dict)  # "503 QueueTimeout": n

    @property
    def requests(self) -> int:
        return self.ok + self.refused + len(self.wrong) + len(self.hung)

    def percentile_seconds(self, q: float) -> float:
        if not self.latencies_seconds:
            return 0.0
        if len(self.latencies_seconds) == 1:
            return self.latencies_seconds[0]
        return statistics.quantiles(self.latencies_seconds, n=100, method="inclusive")[int(q) - 1]


async def one_request(
    http: httpx.AsyncClient,
    reference: Reference,
    expected: Expected,
    seed: int,
    outcomes: Outcomes,
    *,
    timeout_seconds: float,
) -> None:
    """Send input `seed` to `expected.name` through the gateway and classify the outcome."""
    began = time.monotonic()
    try:
        r = await http.post(
            f"/v2/models/{expected.name}/infer",
            json=reference.bodies[seed],
            timeout=timeout_seconds,
        )
    except httpx.TimeoutException as e:
        outcomes.hung.append(f"{expected.name}: no answer in {timeout_seconds} s ({e!r})")
        return
    except httpx.HTTPError as e:
        outcomes.hung.append(f"{expected.name}: connection lost ({e!r})")
        return
    outcomes.latencies_seconds.append(time.monotonic() - began)
    if r.status_code in (429, 503) and r.headers.get("Retry-After", "").isdigit():
        outcomes.refused += 1
        try:
            reason = f"{r.status_code} {r.json().get('reason', '')}".strip()
        except ValueError:
            reason = str(r.status_code)
        outcomes.refusal_reasons[reason] = outcomes.refusal_reasons.get(reason, 0) + 1
        return
    if r.status_code != 200:
        outcomes.wrong.append(f"{expected.name}: {r.status_code} {r.text[:200]}")
        return
    problem = reference.problem(seed, expected, r.json())
    if problem is None:
        outcomes.ok += 1
    else:
        outcomes.wrong.append(f"{expected.name}: {problem}")


@dataclass(frozen=True)
class BurstResult:
    outcomes: Outcomes
    wall_seconds: float

    @property
    def throughput_rps(self) -> float:
        return self.outcomes.ok / self.wall_seconds if self.wall_seconds else 0.0


async def burst(
    gateway_url: str,
    reference: Reference,
    models: Sequence[Expected],
    *,
    clients: int,
    requests_per_client: int,
    timeout_seconds: float,
) -> BurstResult:
    """`clients` concurrent clients, client i calling models[i % len(models)] with inputs
    i, i+1, … (mod INPUT_SEEDS), all released at once.

    Each client has its own connection (an httpx client of its own): one pool of a
    thousand connections costs httpcore more CPU per request than the gateway spends."""
    outcomes = Outcomes()
    start, all_ready = asyncio.Event(), asyncio.Event()
    ready = 0
    tls = ssl.create_default_context()  # built once: each client would load the CA file

    async def client(i: int) -> None:
        async with httpx.AsyncClient(
            base_url=gateway_url, trust_env=False, timeout=timeout_seconds, verify=tls
        ) as http:
            nonlocal ready
            ready += 1
            if ready == clients:
                all_ready.set()
            await start.wait()
            for j in range(requests_per_client):
                seed = (i + j) % INPUT_SEEDS
                await one_request(
                    http, reference, models[i % len(models)], seed, outcomes,
                    timeout_seconds=timeout_seconds,
                )  # fmt: skip

    tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    await all_ready.wait()
    began = time.monotonic()
    start.set()
    await asyncio.gather(*tasks)
    wall = time.monotonic() - began
    return BurstResult(outcomes, wall)


def raise_open_files(at_least: int) -> None:
    """This test process (and the children it starts from now) may open `at_least` files:
    the soft RLIMIT_NOFILE raised up to the hard limit, never the machine's settings."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= at_least:
        return
    if hard != resource.RLIM_INFINITY and hard < at_least:
        raise AssertionError(f"RLIMIT_NOFILE hard limit {hard} < {at_least} needed")
    resource.setrlimit(resource.RLIMIT_NOFILE, (at_least, hard))


# -- what a process holds --------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    rss_bytes: int
    fds: int
    threads: int


def usage(pid: int) -> Usage:
    """The process's resident memory, open fds and threads, read from /proc."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return Usage(rss_bytes=rss, fds=len(os.listdir(f"/proc/{pid}/fd")), threads=threads)


def processes_mentioning(marker: str) -> list[str]:
    """Command lines of running processes that contain `marker` (a run's folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes()
            if marker.encode() in cmdline:
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found
