"""`make demo`: modelswap's local mode with the example models, end to end.

Starts `modelswap up` on a copy of examples/*.yaml (models from examples/models; one sim
GPU of 240Mi that holds the pinned chat model and one more, so models compete), sends a
scripted request pattern through the gateway and checks every answer against
examples/models/reference.py:

  1. chat (pinned)              three streamed generations: resident throughout
  2. burst on a cold model      50 concurrent KServe v2 requests to classify while it is
                                out: one swap-in, every waiter served in order
  3. request-triggered swap-in  summarize, evicted by the burst, swaps back in
  4. live policy edit           summarize's file gets `idleAfter: 10s`; the agent swaps it
                                out once idle (waiting past idleAfter)
  5. swap-in from host memory   summarize again: restored from the host store
  6. OpenAI model list          /v1/models names the three models

It prints a summary (per-model swaps, swap-in latencies, queue waits, refusals,
correctness) with a residency chart, stops local mode with SIGINT and checks that nothing
is left (no process of the run, no Triton shm region). Exit 0 only when every answer was
right and nothing was left running.

    .venv/bin/python tools/demo.py [--keep-logs]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MIB = 1 << 20
BURST = 50
#: ModelDeployment name -> the name users call (spec.model.name) where they differ.
USER_NAMES = {"chat-pinned": "chat"}
T = TypeVar("T")


@dataclass
class Step:
    title: str
    latencies_seconds: list[float] = field(default_factory=list)
    ok: int = 0
    wrong: list[str] = field(default_factory=list)
    codes: dict[int, int] = field(default_factory=dict)


@dataclass
class Demo:
    gateway: str
    control: str
    metrics: str
    token: str
    folder: Path
    steps: list[Step] = field(default_factory=list)
    timeline: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def correct(self) -> int:
        return sum(s.ok for s in self.steps)

    @property
    def wrong(self) -> list[str]:
        return [w for s in self.steps for w in s.wrong]


# -- talking to local mode -------------------------------------------------------------------


async def eventually(probe: Callable[[], Awaitable[T]], *, timeout_seconds: float, what: str) -> T:
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def models(demo: Demo, client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    r = await client.get(
        f"{demo.control}/v1/models", headers={"Authorization": f"Bearer {demo.token}"}
    )
    r.raise_for_status()
    return {m["name"]: m for m in r.json()["models"]}


async def gateway_metrics(demo: Demo, client: httpx.AsyncClient) -> dict[str, dict[str, float]]:
    """Per model: queue-wait count/sum, refusals, gateway-triggered swap-ins."""
    text = (await client.get(demo.metrics)).text
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            model = sample.labels.get("model")
            if model is None:
                continue
            slot = out.setdefault(model, {})
            if sample.name == "modelswap_gateway_queue_wait_seconds_count":
                slot["waits"] = slot.get("waits", 0.0) + sample.value
            elif sample.name == "modelswap_gateway_queue_wait_seconds_sum":
                slot["wait_sum"] = slot.get("wait_sum", 0.0) + sample.value
            elif sample.name == "modelswap_gateway_refusals_total":
                slot["refusals"] = slot.get("refusals", 0.0) + sample.value
            elif sample.name == "modelswap_gateway_swap_ins_triggered_total":
                slot["triggered"] = slot.get("triggered", 0.0) + sample.value
    return out


async def sample_timeline(demo: Demo, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
    marks = {"Resident": "█", "SwappingIn": "▒", "SwappingOut": "▒", "Loading": "▒"}
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            for name, info in (await models(demo, client)).items():
                demo.timeline.setdefault(name, []).append(marks.get(info["phase"], "·"))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


# -- the example models through the gateway --------------------------------------------------


async def mlp_request(demo: Demo, client: httpx.AsyncClient, step: Step, seed: int) -> None:
    from examples.models.reference import (  # noqa: PLC0415
        mlp_checksum,
        mlp_forward,
        mlp_infer_body,
        mlp_input,
    )

    x = mlp_input(seed)
    body = mlp_infer_body(x)
    started = time.monotonic()
    r = await client.post(f"{demo.gateway}/v2/models/classify/infer", json=body)
    step.latencies_seconds.append(time.monotonic() - started)
    step.codes[r.status_code] = step.codes.get(r.status_code, 0) + 1
    if r.status_code != 200:
        step.wrong.append(f"classify seed {seed}: HTTP {r.status_code} {r.text[:200]}")
        return
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    got = np.array(outputs["OUTPUT0"]["data"], dtype=np.float64).reshape(x.shape[0], -1)
    checksum = int(outputs["CHECKSUM"]["data"][0])
    if not np.allclose(got, mlp_forward(x), rtol=1e-4, atol=1e-4):
        step.wrong.append(f"classify seed {seed}: outputs differ from the reference")
    elif checksum != mlp_checksum(32 * MIB):
        step.wrong.append(f"classify seed {seed}: weights checksum {checksum} is wrong")
    else:
        step.ok += 1


async def tinylm_request(  # noqa: PLR0917 - one call shape, read at each use
    demo: Demo, client: httpx.AsyncClient, step: Step, model: str, prompt: list[int], n: int
) -> bool:
    """One streamed generation; True when it says its weights came from the host store."""
    from examples.models.reference import tinylm_checksum, tinylm_generate  # noqa: PLC0415

    started = time.monotonic()
    events: list[dict[str, Any]] = []
    body = {"PROMPT": prompt, "MAX_TOKENS": n}
    url = f"{demo.gateway}/v2/models/{model}/generate_stream"
    async with client.stream("POST", url, json=body) as r:
        status = r.status_code
        if status == 200:
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
        else:
            text = (await r.aread()).decode(errors="replace")
    step.latencies_seconds.append(time.monotonic() - started)
    step.codes[status] = step.codes.get(status, 0) + 1
    if status != 200:
        step.wrong.append(f"{model}: HTTP {status} {text[:200]}")
        return False
    expected = [t.token for t in tinylm_generate(prompt, n)]
    tokens = [int(e.get("TOKEN", -1)) for e in events]
    checksum = int(events[-1].get("CHECKSUM", -1)) if events else -1
    if any("error" in e for e in events) or tokens != expected:
        step.wrong.append(f"{model} {prompt}: tokens {tokens} != reference {expected}")
    elif checksum != tinylm_checksum(64 * MIB):
        step.wrong.append(f"{model}: weights checksum {checksum} is wrong")
    else:
        step.ok += 1
    return bool(events and events[-1].get("RESTORED"))


async def openai_completion(  # noqa: PLR0917 - one call shape, read at each use
    demo: Demo, client: httpx.AsyncClient, step: Step, model: str, prompt: str, n: int
) -> None:
    """`/v1/completions` twice, aggregated and streamed; both must spell the reference."""
    from examples.models.reference import tinylm_complete  # noqa: PLC0415

    expected = tinylm_complete(prompt, n)
    url = f"{demo.gateway}/v1/completions"
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": n}
    started = time.monotonic()
    r = await client.post(url, json=body)
    step.latencies_seconds.append(time.monotonic() - started)
    step.codes[r.status_code] = step.codes.get(r.status_code, 0) + 1
    text = r.json()["choices"][0]["text"] if r.status_code == 200 else r.text[:200]
    if text == expected:
        step.ok += 1
    else:
        step.wrong.append(f"{model} completion {text!r} != reference {expected!r}")
    chunks: list[str] = []
    started = time.monotonic()
    async with client.stream("POST", url, json={**body, "stream": True}) as streamed:
        status = streamed.status_code
        async for line in streamed.aiter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:])["choices"][0]["text"])
    step.latencies_seconds.append(time.monotonic() - started)
    step.codes[status] = step.codes.get(status, 0) + 1
    if "".join(chunks) == expected and len([c for c in chunks if c]) == n:
        step.ok += 1
    else:
        step.wrong.append(f"{model} streamed {chunks!r} != reference {expected!r} token by token")


# -- the scenario ---------------------------------------------------------------------------


def _cold(info: dict[str, Any]) -> bool:
    return info["phase"] in ("SwappedOut", "Dropped")


async def scenario(demo: Demo) -> None:
    limits = httpx.Limits(max_connections=BURST + 10)
    async with httpx.AsyncClient(timeout=120.0, trust_env=False, limits=limits) as client:

        async def loaded() -> bool:
            found = await models(demo, client)
            return len(found) == 3 and all(
                m["phase"] not in ("Pending", "Loading") for m in found.values()
            )

        await eventually(loaded, timeout_seconds=90, what="the three models to load")
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_timeline(demo, client, stop))
        try:
            await _steps(demo, client)
        finally:
            stop.set()
            await sampler


async def _steps(demo: Demo, client: httpx.AsyncClient) -> None:
    chat = Step("chat (pinned): 3 streamed generations")
    demo.steps.append(chat)
    for i in range(3):
        await tinylm_request(demo, client, chat, "chat", [1, 2, 3 + i], 8)

    # Make classify cold: summarize in (evicting classify if it is resident), then wait.
    warm = Step("summarize: first request")
    demo.steps.append(warm)
    await tinylm_request(demo, client, warm, "summarize", [5, 6, 7], 6)

    async def classify_cold() -> bool:
        return _cold((await models(demo, client))["classify"])

    await eventually(classify_cold, timeout_seconds=60, what="classify to be out of HBM")

    before = await models(demo, client)
    burst = Step(f"burst: {BURST} concurrent v2 requests to cold classify")
    demo.steps.append(burst)
    await asyncio.gather(*(mlp_request(demo, client, burst, seed) for seed in range(BURST)))
    after = await models(demo, client)
    swap_ins = after["classify"]["swapIns"] - before["classify"]["swapIns"]
    demo.notes.append(f"burst on cold classify: {swap_ins} swap-in(s) for {BURST} requests")
    if swap_ins != 1:
        burst.wrong.append(f"the burst caused {swap_ins} swap-ins of classify, not exactly one")

    back = Step("summarize: request-triggered swap-in")
    demo.steps.append(back)
    if not _cold(after["summarize"]):
        demo.notes.append("summarize was still resident after the burst (no eviction)")
    await tinylm_request(demo, client, back, "summarize", [9, 8, 7, 6], 6)

    # A live policy edit: summarize swaps out after 10 idle seconds instead of 20.
    file = demo.folder / "summarize-idle-preserve-kv.yaml"
    file.write_text(file.read_text().replace("idleAfter: 20s", "idleAfter: 10s"))
    edited = time.monotonic()

    async def summarize_out() -> bool:
        return _cold((await models(demo, client))["summarize"])

    await eventually(summarize_out, timeout_seconds=60, what="summarize's idle swap-out")
    demo.notes.append(
        f"live edit idleAfter 20s -> 10s: summarize swapped out {time.monotonic() - edited:.1f}s "
        "after the edit"
    )

    restore = Step("summarize: swap-in from host memory")
    demo.steps.append(restore)
    await tinylm_request(demo, client, restore, "summarize", [1, 2, 3], 6)

    again = Step("chat (pinned): again")
    demo.steps.append(again)
    await tinylm_request(demo, client, again, "chat", [4, 5, 6], 8)
    final = await models(demo, client)
    if final["chat-pinned"]["swapOuts"] != 0:
        again.wrong.append("the pinned chat model was swapped out")

    completion = Step("OpenAI: chat completion, streamed and not")
    demo.steps.append(completion)
    await openai_completion(demo, client, completion, "chat", "hello modelswap", 8)

    listing = Step("OpenAI: GET /v1/models")
    demo.steps.append(listing)
    r = await client.get(f"{demo.gateway}/v1/models")
    ids = sorted(m["id"] for m in r.json().get("data", []))
    listing.codes[r.status_code] = 1
    if ids == ["chat", "classify", "summarize"]:
        listing.ok += 1
    else:
        listing.wrong.append(f"/v1/models listed {ids}")


# -- the summary -----------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:7.0f}"


def bar(value: float, top: float, width: int = 30) -> str:
    filled = 0 if top <= 0 else round(width * value / top)
    return "█" * filled


def summary(
    demo: Demo,
    final: dict[str, dict[str, Any]],
    gw: dict[str, dict[str, float]],
    elapsed_seconds: float,
) -> str:
    lines = ["", "modelswap demo — local mode: real Triton on the CPU, one sim GPU of 240Mi", ""]
    lines.append(f"{'step':58} {'reqs':>4} {'ok':>4} {'p50 ms':>7} {'max ms':>7}  codes")
    for s in demo.steps:
        lat = s.latencies_seconds or [0.0]
        codes = ",".join(f"{c}x{n}" for c, n in sorted(s.codes.items()))
        lines.append(
            f"{s.title:58} {len(s.latencies_seconds) or 1:>4} {s.ok:>4} "
            f"{_ms(statistics.median(lat))} {_ms(max(lat))}  {codes}"
        )
    lines += [
        "",
        f"{'model':10} {'swap-ins':>8} {'swap-outs':>9} {'last swap-in':>12} "
        f"{'queue waits':>11} {'mean wait':>9} {'refusals':>8}  phase",
    ]
    for name in sorted(final):
        info, g = final[name], gw.get(USER_NAMES.get(name, name), {})
        last = info.get("lastSwapInSeconds")
        waits = int(g.get("waits", 0))
        mean = g.get("wait_sum", 0.0) / waits if waits else 0.0
        lines.append(
            f"{name:10} {info['swapIns']:>8} {info['swapOuts']:>9} "
            f"{(f'{last * 1000:.0f} ms' if last else '-'):>12} {waits:>11} "
            f"{(f'{mean * 1000:.0f} ms' if waits else '-'):>9} {int(g.get('refusals', 0)):>8}  "
            f"{info['phase']}"
        )
    lines += ["", "request latency (max per step):"]
    top = max((max(s.latencies_seconds) for s in demo.steps if s.latencies_seconds), default=0)
    for s in demo.steps:
        if s.latencies_seconds:
            peak = max(s.latencies_seconds)
            lines.append(f"  {s.title[:44]:44} {bar(peak, top)} {peak * 1000:.0f} ms")
    lines += ["", "residency over time (█ resident, ▒ moving, · out of HBM; one mark ≈ 0.5 s):"]
    for name in sorted(demo.timeline):
        marks = demo.timeline[name]
        step = max(1, -(-len(marks) // 70))
        lines.append(f"  {name:10} {''.join(marks[::step])}")
    lines += [""] + [f"- {note}" for note in demo.notes]
    total = demo.correct + len(demo.wrong)
    lines.append("")
    lines.append(f"correctness: {demo.correct}/{total} responses correct")
    for wrong in demo.wrong:
        lines.append(f"  WRONG: {wrong}")
    lines.append(f"elapsed: {elapsed_seconds:.1f} s")
    return "\n".join(lines)


# -- running local mode ----------------------------------------------------------------------


def leftovers(run_dir: Path, shm_prefix: str | None, pgid: int) -> list[str]:
    """Processes of this run (its run directory on their command line, or in its process
    group) and Triton shm regions still present."""
    found = []
    marker = str(run_dir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            group = os.getpgid(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
        if marker in cmdline or group == pgid:
            shown = cmdline.replace(b"\0", b" ").decode(errors="replace")[:120]
            found.append(f"process {entry.name}: {shown}")
    if shm_prefix:
        found += [f"shm region {p}" for p in Path("/dev/shm").glob(f"{shm_prefix}*")]
    return found


def wait_for_state(
    path: Path, up: subprocess.Popen[bytes], timeout_seconds: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise RuntimeError(f"modelswap up exited with status {up.returncode}")
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(path.read_text())
            if state.get("running") and state.get("pushes", 0) >= 1:
                return dict(state)
        time.sleep(0.1)
    raise TimeoutError("modelswap up did not push the models in time")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-logs", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # examples.models.reference
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="modelswap-demo-"))
    folder, run_dir, log_path = tmp / "deployments", tmp / "run", tmp / "up.log"
    folder.mkdir()
    for file in sorted(EXAMPLES.glob("*.yaml")):
        shutil.copy(file, folder / file.name)
    command = [
        sys.executable, "-m", "modelswap_api.cli", "up", "-f", str(folder),
        "--model-root", str(EXAMPLES / "models"), "--run-dir", str(run_dir), "--port", "0",
        # The example models read their weights through host views: sim GPUs even where a
        # real one is present.
        "--allocator", "sim",
    ]  # fmt: skip
    print(f"modelswap demo: starting local mode (log: {log_path})", flush=True)
    with log_path.open("wb") as log:
        up = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
        )
    pgid = up.pid
    failure = ""
    demo: Demo | None = None
    text = ""
    shm_prefix = None
    try:
        state = wait_for_state(run_dir / "local.json", up, 60)
        shm_prefix = state.get("shmPrefix")
        demo = Demo(
            gateway=state["gatewayUrl"],
            control=state["controlUrl"],
            metrics=state["metricsUrl"],
            token=Path(state["tokenFile"]).read_text().strip(),
            folder=folder,
        )
        print(f"modelswap demo: gateway {demo.gateway}; running the scenario", flush=True)
        asyncio.run(scenario(demo))
        text = asyncio.run(_final(demo, time.monotonic() - started))
    except Exception as e:  # report, then still stop and check
        failure = f"{type(e).__name__}: {e}"
    finally:
        if up.poll() is None:
            os.killpg(pgid, signal.SIGINT)  # what Ctrl-C does
        try:
            up.wait(timeout=45)
        except subprocess.TimeoutExpired:
            failure = failure or "modelswap up did not stop within 45 s of SIGINT"
            os.killpg(pgid, signal.SIGKILL)
            up.wait()
    left = leftovers(run_dir, shm_prefix, pgid)
    if text:
        print(text)
    print(f"stopped local mode with SIGINT: exit status {up.returncode}")
    print("left running: " + ("nothing" if not left else "; ".join(left)))
    for item in left:
        print(f"  LEFT: {item}")
    if failure:
        print(f"FAILED: {failure}")
        print("".join(log_path.read_text(errors="replace").splitlines(True)[-40:]))
    ok = not failure and not left and demo is not None and not demo.wrong and up.returncode == 0
    if args.keep_logs or not ok:
        print(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"demo {'passed' if ok else 'FAILED'} in {time.monotonic() - started:.1f} s")
    return 0 if ok else 1


async def _final(demo: Demo, elapsed_seconds: float) -> str:
    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as client:
        final = await models(demo, client)
        gw = await gateway_metrics(demo, client)
    return summary(demo, final, gw, elapsed_seconds)


if __name__ == "__main__":
    sys.exit(main())
