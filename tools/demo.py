"""`make demo`: modelswap's local mode with the real example models, end to end.

Starts `modelswap up` on a copy of examples/*.yaml: `embed` (all-MiniLM-L6-v2 with its
real weights) and `tinyllama` (a Llama-architecture model with random weights from a fixed
seed), both Hugging Face models in Triton python backends whose weights live in modelswap
memory (a copy of examples/models), on one sim GPU. It sends a scripted request pattern through the
gateway and checks every answer against the same models run with plain transformers in
this process (examples/models/reference.py: embeddings within 1e-6, greedy tokens equal):

  1. embed                      KServe v2 and OpenAI /v1/embeddings (float and base64)
  2. tinyllama                  OpenAI completions, aggregated and streamed, and a chat
  3. idle swap-out              embed's file gets `idleAfter: 5s, minResident: 2s` (a live
                                policy edit); the agent swaps it out once idle
  4. burst on a cold model      50 concurrent /v1/embeddings requests while embed is out:
                                one swap-in, every waiter served
  5. idle swap-out, swap-in     the same edit of tinyllama's file; once it is out, a
                                request swaps it back in from host memory
  6. request-triggered swap-in  embed, out again after its idle time, swapped in by a request
  7. OpenAI model list          /v1/models names both models

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
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
#: One sim GPU that holds both models (87 MiB and 3 MiB of weights) under its watermark:
#: what moves them out here is the idle policy, which the demo tightens as it goes.
SIM_GPU = "128Mi"
BURST = 50
TOLERANCE = 1e-6
#: How often the residency timeline looks at the models' phases.
SAMPLE_SECONDS = 0.25
T = TypeVar("T")

#: One v2 request each: a batch of texts, then a single one.
EMBED_V2 = (
    (
        "modelswap pages idle models out of GPU memory",
        "and back in when a request arrives",
        "Ünïcødé and emoji 🚀 are text too",
    ),
    ("a single sentence",),
)
EMBED_OPENAI = ("A cold model costs a paging event.", "not a reload")
BURST_TEXTS = tuple(f"burst request {i}: is the cold model back yet?" for i in range(BURST))
#: (prompt, max_tokens) for /v1/completions; (messages, max_tokens) for the chat route.
COMPLETIONS = (("Once upon a time", 24), ("modelswap swaps models", 16))
CHAT = ([{"role": "user", "content": "hello, who are you?"}], 20)


@dataclass
class Step:
    title: str
    latencies_seconds: list[float] = field(default_factory=list)
    ok: int = 0
    wrong: list[str] = field(default_factory=list)
    codes: dict[int, int] = field(default_factory=dict)

    def answered(self, started: float, status: int) -> None:
        self.latencies_seconds.append(time.monotonic() - started)
        self.codes[status] = self.codes.get(status, 0) + 1


@dataclass
class References:
    """Every expected answer, from the same models run with plain transformers here."""

    embed_v2: list[tuple[np.ndarray, np.ndarray]]
    embed_openai: tuple[np.ndarray, np.ndarray]
    burst: list[tuple[np.ndarray, np.ndarray]]
    completions: list[str]
    chat: str

    @classmethod
    def compute(cls) -> References:
        from examples.models.reference import (  # noqa: PLC0415 - torch, after the start
            embed_texts,
            tinyllama_text,
        )
        from modelswap_sidecar.gateway.openai import chat_prompt  # noqa: PLC0415

        return cls(
            embed_v2=[embed_texts(texts) for texts in EMBED_V2],
            embed_openai=embed_texts(EMBED_OPENAI),
            burst=[embed_texts([text]) for text in BURST_TEXTS],
            completions=[tinyllama_text(prompt, n) for prompt, n in COMPLETIONS],
            chat=tinyllama_text(chat_prompt(CHAT[0]), CHAT[1]),
        )


@dataclass
class Demo:
    gateway: str
    control: str
    metrics: str
    token: str
    folder: Path
    #: ModelDeployment name -> the name users call (spec.model.name)
    user_names: dict[str, str]
    #: ModelDeployment name -> its file in `folder`
    files: dict[str, str]
    steps: list[Step] = field(default_factory=list)
    timeline: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    references: References | None = None

    @property
    def correct(self) -> int:
        return sum(s.ok for s in self.steps)

    @property
    def wrong(self) -> list[str]:
        return [w for s in self.steps for w in s.wrong]

    @property
    def expected(self) -> References:
        assert self.references is not None
        return self.references

    def step(self, title: str) -> Step:
        self.steps.append(Step(title))
        return self.steps[-1]


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
            await asyncio.wait_for(stop.wait(), SAMPLE_SECONDS)


# -- the example models through the gateway --------------------------------------------------


def _differs(got: np.ndarray, expected: np.ndarray) -> str | None:
    """Why `got` is not `expected` within TOLERANCE, or None."""
    if got.shape != expected.shape:
        return f"shape {got.shape} != {expected.shape}"
    difference = float(np.max(np.abs(got - expected))) if got.size else 0.0
    return None if difference <= TOLERANCE else f"max abs difference {difference:.3g}"


async def embed_v2(client: httpx.AsyncClient, demo: Demo, step: Step, index: int) -> None:
    """KServe v2: one request with the texts of EMBED_V2[index]."""
    from examples.models.reference import embed_infer_body, embed_outputs  # noqa: PLC0415

    texts = EMBED_V2[index]
    started = time.monotonic()
    r = await client.post(f"{demo.gateway}/v2/models/embed/infer", json=embed_infer_body(texts))
    step.answered(started, r.status_code)
    if r.status_code != 200:
        step.wrong.append(f"embed v2: HTTP {r.status_code} {r.text[:200]}")
        return
    rows, tokens = embed_outputs(r.json())
    expected_rows, expected_tokens = demo.expected.embed_v2[index]
    why = _differs(rows, expected_rows)
    if why is None and tokens.tolist() != expected_tokens.tolist():
        why = f"prompt_tokens {tokens.tolist()} != {expected_tokens.tolist()}"
    if why:
        step.wrong.append(f"embed v2 {texts[0][:30]!r}...: {why}")
    else:
        step.ok += 1


async def embed_openai(  # noqa: PLR0917 - one call shape, read at each use
    client: httpx.AsyncClient,
    demo: Demo,
    step: Step,
    texts: tuple[str, ...],
    expected: tuple[np.ndarray, np.ndarray],
    encoding: str = "float",
) -> None:
    """`/v1/embeddings`: every row within TOLERANCE, usage the tokens' sum."""
    body: dict[str, Any] = {"model": "embed", "input": list(texts)}
    if encoding != "float":
        body["encoding_format"] = encoding
    started = time.monotonic()
    r = await client.post(f"{demo.gateway}/v1/embeddings", json=body)
    step.answered(started, r.status_code)
    if r.status_code != 200:
        step.wrong.append(f"/v1/embeddings: HTTP {r.status_code} {r.text[:200]}")
        return
    answer = r.json()
    data = sorted(answer["data"], key=lambda d: d["index"])
    if encoding == "base64":
        import base64  # noqa: PLC0415

        rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data]
    else:
        rows = [np.array(d["embedding"], dtype=np.float32) for d in data]
    why = _differs(np.stack(rows), expected[0]) if rows else "no rows"
    if why is None and answer["usage"]["prompt_tokens"] != int(expected[1].sum()):
        why = f"usage.prompt_tokens {answer['usage']['prompt_tokens']} != {int(expected[1].sum())}"
    if why:
        step.wrong.append(f"/v1/embeddings ({encoding}) {texts[0][:30]!r}: {why}")
    else:
        step.ok += 1


async def completion(  # noqa: PLR0917 - one call shape, read at each use
    client: httpx.AsyncClient,
    demo: Demo,
    step: Step,
    route: str,
    body: dict[str, Any],
    expected: str,
) -> None:
    """One OpenAI completion or chat, aggregated (`stream` false) or streamed, whose text
    must be the greedy text of plain transformers."""
    url = f"{demo.gateway}/v1/{route}"
    streamed = bool(body.get("stream"))
    started = time.monotonic()
    pieces: list[str] = []
    async with client.stream("POST", url, json=body) as r:
        status = r.status_code
        if status != 200:
            text = (await r.aread()).decode(errors="replace")[:200]
        elif streamed:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    pieces.append(
                        choice.get("text") or choice.get("delta", {}).get("content") or ""
                    )
        else:
            choice = json.loads(await r.aread())["choices"][0]
            pieces.append(
                choice["text"] if route == "completions" else choice["message"]["content"]
            )
    step.answered(started, status)
    kind = f"{route}{' streamed' if streamed else ''}"
    if status != 200:
        step.wrong.append(f"tinyllama {kind}: HTTP {status} {text}")
    elif "".join(pieces) != expected:
        step.wrong.append(f"tinyllama {kind}: {''.join(pieces)!r} != reference {expected!r}")
    else:
        step.ok += 1


async def tinyllama_completions(
    client: httpx.AsyncClient, demo: Demo, step: Step, *, stream: bool
) -> None:
    for (prompt, n), expected in zip(COMPLETIONS, demo.expected.completions, strict=True):
        body = {"model": "tinyllama", "prompt": prompt, "max_tokens": n, "stream": stream}
        await completion(client, demo, step, "completions", body, expected)


async def tinyllama_chat(client: httpx.AsyncClient, demo: Demo, step: Step) -> None:
    messages, n = CHAT
    body = {"model": "tinyllama", "messages": messages, "max_tokens": n, "stream": True}
    await completion(client, demo, step, "chat/completions", body, demo.expected.chat)


# -- the scenario ---------------------------------------------------------------------------


def _cold(info: dict[str, Any]) -> bool:
    return info["phase"] in ("SwappedOut", "Dropped")


async def edit_policy(demo: Demo, client: httpx.AsyncClient, name: str, **policy: str) -> str:
    """A live policy edit, as a user makes it: swapPolicy fields of `name`'s file rewritten;
    returns once the agent holds the new generation. What changed, for the notes."""
    path = demo.folder / demo.files[name]
    doc = yaml.safe_load(path.read_text())
    fields = doc["spec"].setdefault("swapPolicy", {})
    changes = [f"{k} {fields.get(k, 'unset')} -> {v}" for k, v in policy.items()]
    fields.update(policy)
    generation = (await models(demo, client))[name]["generation"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))

    async def applied() -> bool:
        return bool((await models(demo, client))[name]["generation"] > generation)

    # a refused edit (the folder's problems, in local mode's log) times out here
    await eventually(applied, timeout_seconds=20, what=f"the edit of {path.name} to apply")
    return f"the edit {', '.join(changes)}"


async def scenario(demo: Demo) -> None:
    limits = httpx.Limits(max_connections=BURST + 10)
    async with httpx.AsyncClient(timeout=120.0, trust_env=False, limits=limits) as client:
        # The references (torch and transformers here) while the models load there.
        references = asyncio.create_task(asyncio.to_thread(References.compute))

        async def loaded() -> bool:
            found = await models(demo, client)
            return len(found) == len(demo.user_names) and all(
                m["phase"] not in ("Pending", "Loading") for m in found.values()
            )

        await eventually(loaded, timeout_seconds=150, what="the models to load")
        demo.references = await references
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_timeline(demo, client, stop))
        try:
            await _steps(demo, client)
        finally:
            stop.set()
            await sampler


async def _wait_cold(demo: Demo, client: httpx.AsyncClient, name: str, since: str) -> None:
    """Until the agent has swapped `name` out for being idle; noted with the wait."""
    started = time.monotonic()

    async def cold() -> bool:
        return _cold((await models(demo, client))[name])

    await eventually(cold, timeout_seconds=60, what=f"{name}'s idle swap-out")
    seconds = time.monotonic() - started
    demo.notes.append(f"{name} swapped out when idle: waited {seconds:.1f} s after {since}")


async def _steps(demo: Demo, client: httpx.AsyncClient) -> None:
    first = demo.step("embed: KServe v2 and /v1/embeddings")
    for index in range(len(EMBED_V2)):
        await embed_v2(client, demo, first, index)
    for encoding in ("float", "base64"):
        await embed_openai(client, demo, first, EMBED_OPENAI, demo.expected.embed_openai, encoding)

    generated = demo.step("tinyllama: completions (aggregated, streamed), chat")
    await tinyllama_completions(client, demo, generated, stream=False)
    await tinyllama_completions(client, demo, generated, stream=True)
    await tinyllama_chat(client, demo, generated)

    # A live policy edit: embed swaps out after 5 idle seconds instead of 60.
    edit = await edit_policy(demo, client, "embed", idleAfter="5s", minResident="2s")
    await _wait_cold(demo, client, "embed", edit)

    before = await models(demo, client)
    burst = demo.step(f"burst: {BURST} concurrent /v1/embeddings to cold embed")
    await asyncio.gather(
        *(
            embed_openai(client, demo, burst, (text,), expected)
            for text, expected in zip(BURST_TEXTS, demo.expected.burst, strict=True)
        )
    )
    after = await models(demo, client)
    swap_ins = after["embed"]["swapIns"] - before["embed"]["swapIns"]
    demo.notes.append(f"burst on cold embed: {swap_ins} swap-in(s) for {BURST} requests")
    if swap_ins != 1:
        burst.wrong.append(f"the burst caused {swap_ins} swap-ins of embed, not exactly one")

    edit = await edit_policy(demo, client, "tinyllama", idleAfter="5s", minResident="2s")
    await _wait_cold(demo, client, "tinyllama", edit)
    back = demo.step("tinyllama: swap-in from host memory, streamed")
    await tinyllama_completions(client, demo, back, stream=True)

    await _wait_cold(demo, client, "embed", "the tinyllama steps")
    again = demo.step("embed: request-triggered swap-in")
    await embed_v2(client, demo, again, 0)
    await embed_openai(client, demo, again, EMBED_OPENAI, demo.expected.embed_openai)

    listing = demo.step("OpenAI: GET /v1/models")
    r = await client.get(f"{demo.gateway}/v1/models")
    ids = sorted(m["id"] for m in r.json().get("data", []))
    listing.codes[r.status_code] = 1
    if ids == sorted(demo.user_names.values()):
        listing.ok += 1
    else:
        listing.wrong.append(f"/v1/models listed {ids}")


# -- the summary -----------------------------------------------------------------------------


def _bucket(marks: list[str]) -> str:
    """One mark for several samples: a swap (▒) or time out of HBM (·) shows even when
    it was shorter than the mark."""
    return next((m for m in ("▒", "·") if m in marks), "█")


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
    lines = [
        "",
        f"modelswap demo — local mode: real Triton on the CPU, one sim GPU of {SIM_GPU}",
        "",
    ]
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
        info, g = final[name], gw.get(demo.user_names.get(name, name), {})
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
    longest = max((len(m) for m in demo.timeline.values()), default=0)
    step = max(1, -(-longest // 70))
    lines += [
        "",
        "residency over time (█ resident, ▒ moving, · out of HBM; "
        f"one mark ≈ {step * SAMPLE_SECONDS:.2g} s):",
    ]
    for name in sorted(demo.timeline):
        marks = demo.timeline[name]
        row = "".join(_bucket(marks[i : i + step]) for i in range(0, len(marks), step))
        lines.append(f"  {name:10} {row}")
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
    # The model folders too: local mode reloads a model whose files change, and the demo
    # must not see edits made to the checkout while it runs.
    models = tmp / "models"
    shutil.copytree(EXAMPLES / "models", models, ignore=shutil.ignore_patterns("__pycache__"))
    user_names, files = {}, {}
    for file in sorted(EXAMPLES.glob("*.yaml")):  # the real models; examples/toy is not
        shutil.copy(file, folder / file.name)
        doc = yaml.safe_load(file.read_text())
        files[doc["metadata"]["name"]] = file.name
        user_names[doc["metadata"]["name"]] = (
            doc["spec"]["model"].get("name") or doc["metadata"]["name"]
        )
    command = [
        sys.executable, "-m", "modelswap_api.cli", "up", "-f", str(folder),
        "--model-root", str(models), "--run-dir", str(run_dir), "--port", "0",
        # The checks compare with CPU references: sim GPUs even where a real one is present.
        "--allocator", "sim", "--sim-gpu-bytes", SIM_GPU,
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
            user_names=user_names,
            files=files,
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
