"""A control-API reload drains the model first (issue 26, fuzz finding): through the real
agent, gateway and Triton.

The full fuzz run saw Triton exit with SIGSEGV right after bursts of
`POST /v1/models/{uid}/reload` on the toy models while clients sent inference through the
gateway: a reload unloaded the model from Triton with requests still in flight to it.
Now a reload holds the model's new requests in the gateway (queued, as during a swap-in)
and waits for those in flight (at most `policy.drainTimeoutSeconds`, then ends them as a
swap-out's overdue drain does: 503 `DrainDeadline`) before the unload; a reload asked
while one is under way joins it.

- `test_reload_and_swap_bursts_under_traffic_leave_triton_serving`: bursts of control calls
  on two toys (batched, attached; heldgen) while four clients send inference: first three
  reloads per model at once (one runs, two join it), then reloads keeping or dropping the
  host copy mixed with manual swap-outs and swap-ins (seeded). Triton is the same process
  throughout with no crash in its log, every control call is answered (none hangs), every
  inference answer is a right 200 or a 503/429 with Retry-After (never Triton's own
  error), and every model serves afterwards. On the code before, clients saw thousands of
  Triton 404s ("unknown model") and, with swaps mixed in, a reload's unload waited a
  minute on a request whose model's own swap-in queued behind it.
- `test_reload_waits_for_a_request_in_flight_and_serves_one_sent_meanwhile`: a short
  generation in flight at the reload completes; a request sent while the reload runs is
  answered after it; an endless stream is ended at the deadline with `DrainDeadline`.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelswap_sidecar.triton.process import free_loopback_port
from tests.support.agent_harness import (
    MIB,
    ROOT,
    AgentConfig,
    Control,
    entry,
    eventually,
    new_uid,
    node,
)
from tests.support.attached_toys import attach_toy
from tests.support.reliability import record

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

TEST_MODELS = ROOT / "tests" / "data" / "gateway_models"
DRAIN_TIMEOUT_SECONDS = 2.0
#: Bursts of control calls per phase (reloads alone, then mixed with swaps).
ROUNDS = 8
SEED = 20261127
CRASH_MARKS = ("bad_alloc", "terminate called", "Aborted", "Segmentation fault", "core dumped")
#: Longer than any answer may take here (a drain, an unload and a load, on 2 loaded cores).
ANSWER_SECONDS = 60.0


def models_folder(tmp_path: Path) -> Path:
    root = tmp_path / "testmodels"
    shutil.copytree(TEST_MODELS / "heldgen", root / "heldgen")
    attach_toy(root, "batched", execute_in_use=True, close_on_finalize=False)
    return root


def config_for(tmp_path: Path, gateway_port: int) -> AgentConfig:
    return AgentConfig(
        gpu_bytes=(256 * MIB,),
        extra={
            "modelRoots": {"/testmodels": str(models_folder(tmp_path))},
            "gateway": {"host": "127.0.0.1", "port": gateway_port},
            "policy": {
                "intervalSeconds": 0.25,
                "retryFailedSeconds": 60.0,
                "drainTimeoutSeconds": DRAIN_TIMEOUT_SECONDS,
            },
        },
    )


def toy_entry(uid: str, model: str) -> dict[str, Any]:
    return entry(
        uid, model=model, name=model, weights="1Mi", source={"uri": f"/testmodels/{model}"}
    )


def batched_body(value: float) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "shape": [1, 2, 3], "datatype": "FP32",
                        "data": [value] * 6}]}  # fmt: skip


def judge(response: httpx.Response, expected: list[float] | str | None) -> str | None:
    """What is wrong with an answer (None: nothing). `expected`: batched's OUTPUT0, or the
    text a generation must answer."""
    if response.status_code in (429, 503):
        if not response.headers.get("Retry-After", "").isdigit():
            return f"{response.status_code} without Retry-After: {response.text[:300]}"
        return None
    if response.status_code != 200:
        return f"{response.status_code}: {response.text[:300]}"
    if isinstance(expected, list):
        outputs = {o["name"]: o for o in response.json()["outputs"]}
        if outputs["OUTPUT0"]["data"] != expected:
            return f"wrong answer {outputs['OUTPUT0']['data']} for {expected}"
    elif isinstance(expected, str):
        text = response.json()["choices"][0]["text"]
        if text != expected:
            return f"wrong text {text!r}, not {expected!r}"
    return None


async def reload(control: Control, uid: str) -> httpx.Response:
    return await control.client.post(f"/v1/models/{uid}/reload")


async def control_call(control: Control, uid: str, kind: str) -> httpx.Response:
    """A reload keeping (`keep`) or dropping (`drop`) the host copy, or a manual swap."""
    if kind in ("keep", "drop"):
        return await control.client.post(f"/v1/models/{uid}/reload", params={"hostCopy": kind})
    return await control.swap(uid, kind)


@pytest.mark.timeout(600)
async def test_reload_and_swap_bursts_under_traffic_leave_triton_serving(tmp_path: Path) -> None:
    gateway_port = free_loopback_port()
    uids = {"batched": new_uid(), "heldgen": new_uid()}
    async with node(tmp_path, config_for(tmp_path, gateway_port)) as n:
        triton, agent, control, _ = n.parts()
        await control.desired([toy_entry(uid, model) for model, uid in uids.items()])
        for uid in uids.values():
            await control.wait_state(uid, "Resident", timeout_seconds=120)
        triton_pid = triton.pid
        base = f"http://127.0.0.1:{gateway_port}"
        problems: list[str] = []
        answers: Counter[int] = Counter()
        stop = asyncio.Event()

        async def client(index: int) -> None:
            async with httpx.AsyncClient(base_url=base, timeout=ANSWER_SECONDS,
                                         trust_env=False) as http:  # fmt: skip
                i = 0
                while not stop.is_set():
                    i += 1
                    if index % 2:
                        value = float(index * 1000 + i)
                        r = await http.post("/v2/models/batched/infer", json=batched_body(value))
                        expected: list[float] | str = [value * 2] * 6
                    else:
                        body = {"model": "heldgen", "prompt": "x", "max_tokens": 4,
                                "token_seconds": 0.02}  # fmt: skip
                        r = await http.post("/ns/default/v1/completions", json=body)
                        expected = " t0 t1 t2 t3"
                    answers[r.status_code] += 1
                    problem = judge(r, expected)
                    if problem is not None:
                        problems.append(problem)

        clients = [asyncio.create_task(client(i)) for i in range(4)]
        answered: Counter[str] = Counter()
        draw = random.Random(SEED)
        started = time.monotonic()

        async def bursts(rounds: int, mixed: bool) -> None:
            """Per round, three control calls per model at once: reloads, or (mixed) one
            reload and two drawn among reloads keeping or dropping the host copy and manual
            swaps; then every model serves again before the next round."""
            for round_ in range(rounds):
                calls = []
                for uid in uids.values():
                    kinds = ["keep", "keep", "keep"]
                    if mixed:
                        kinds[1:] = draw.choices(["keep", "drop", "out", "in"], k=2)
                    for kind in kinds:
                        calls.append((kind, control_call(control, uid, kind)))
                for (kind, _), r in zip(
                    calls, await asyncio.gather(*(c for _, c in calls)), strict=True
                ):
                    answered[f"{kind} {r.status_code} {r.json().get('reason')}"] += 1
                    allowed = (200,) if kind in ("keep", "drop") else (200, 409)
                    if r.status_code not in allowed:
                        problems.append(f"{kind} answered {r.status_code}: {r.text[:300]}")
                for uid in uids.values():
                    await control.wait_state(uid, "Resident", "SwappedOut", timeout_seconds=120)
                assert triton.process is not None and triton.process.returncode() is None, (
                    f"Triton exited ({triton.process.returncode()}) after {round_ + 1} bursts"
                )

        try:
            await bursts(ROUNDS, mixed=False)
            # each burst of three ran one reload per model; the other two joined it
            joined = sum(n for k, n in answered.items() if k.startswith("keep 200 Reloading"))
            assert joined == ROUNDS * 6, answered
            await bursts(ROUNDS, mixed=True)
        finally:
            stop.set()
            await asyncio.gather(*clients, return_exceptions=True)
        seconds = time.monotonic() - started
        triton_log = triton.log_path.read_text(errors="replace")
        crashes = [mark for mark in CRASH_MARKS if mark in triton_log]
        assert triton.process is not None and triton.process.returncode() is None
        assert triton.pid == triton_pid, "Triton was restarted"
        assert not crashes, f"Triton's log says {crashes}"
        assert problems == [], "\n".join(problems[:20])
        assert answers[200] > 0, answers
        assert "reload holds new requests" in agent.log_tail(1_000_000)
    record(
        "faults",
        target=f"control-API reloads of two toy models under traffic ({ROUNDS} bursts of 3 "
        f"reloads per model, then {ROUNDS} of reloads and manual swaps mixed)",
        moment="4 clients sending inference through the gateway throughout",
        outcome=f"each reload drained first (held requests queued, none at Triton at the "
        f"unload); concurrent ones joined; Triton the same process, no crash, no hang; "
        f"answers {dict(sorted(answers.items()))}",
        recovery_seconds=round(seconds, 3),
        answers_checked=sum(answers.values()),
        wrong=len(problems),
        lost_bytes=0,
    )


@pytest.mark.timeout(300)
async def test_reload_waits_for_a_request_in_flight_and_serves_one_sent_meanwhile(
    tmp_path: Path,
) -> None:
    gateway_port = free_loopback_port()
    uid = new_uid()
    async with node(tmp_path, config_for(tmp_path, gateway_port)) as n:
        triton, agent, control, _ = n.parts()
        await control.desired([toy_entry(uid, "heldgen")])
        await control.wait_state(uid, "Resident", timeout_seconds=120)
        triton_pid = triton.pid
        base = f"http://127.0.0.1:{gateway_port}/ns/default"
        async with httpx.AsyncClient(
            base_url=base, timeout=ANSWER_SECONDS, trust_env=False
        ) as http:
            # in flight at the reload: 20 tokens, 50 ms apart (about 1 s, inside the drain)
            short = {"model": "heldgen", "prompt": "a", "max_tokens": 20, "token_seconds": 0.05,
                     "stream": True}  # fmt: skip
            async with http.stream("POST", "/v1/completions", json=short) as stream:
                assert stream.status_code == 200
                lines = stream.aiter_lines()
                first = await anext(lines)  # it is at Triton, generating
                reloading = asyncio.create_task(reload(control, uid))

                async def holding() -> bool:
                    return "reload holds new requests" in agent.log_tail(50_000)

                await eventually(holding, timeout_seconds=30, what="the reload's drain")
                # sent while the reload drains: queued, served once the model is back
                meanwhile = asyncio.create_task(http.post(
                    "/v1/completions",
                    json={"model": "heldgen", "prompt": "b", "max_tokens": 2,
                          "token_seconds": 0.01},
                ))  # fmt: skip
                rest = [first] + [line async for line in lines if line.startswith("data: ")]
            chunks = [json.loads(line[len("data: ") :]) for line in rest if line != "data: [DONE]"]
            texts = [chunk["choices"][0]["text"] for chunk in chunks if chunk.get("choices")]
            assert "".join(texts) == "".join(f" t{i}" for i in range(20)), rest[-3:]
            reloaded = await reloading
            assert reloaded.status_code == 200, reloaded.text
            assert reloaded.json()["reason"] == "Reloading"
            answered = await meanwhile
            assert answered.status_code == 200, answered.text
            assert answered.json()["choices"][0]["text"] == " t0 t1"
            assert float(answered.headers["X-Modelswap-Queue-Wait-Seconds"]) > 0

            # an endless stream at the reload: ended at the deadline, never Triton's error
            await control.wait_state(uid, "Resident", timeout_seconds=120)
            endless = {"model": "heldgen", "prompt": "c", "stream": True}
            async with http.stream("POST", "/v1/completions", json=endless) as stream:
                assert stream.status_code == 200
                lines = stream.aiter_lines()
                first = await anext(lines)
                assert json.loads(first[len("data: ") :])["choices"][0]["text"] == " t0"
                started = time.monotonic()
                reloaded = await reload(control, uid)
                waited_seconds = time.monotonic() - started
                assert reloaded.status_code == 200, reloaded.text
                rest = [line async for line in lines if line.startswith("data: ")]
            error = json.loads(rest[-1][len("data: ") :])["error"]
            assert error["code"] == "DrainDeadline", rest[-3:]
            assert "reload" in error["message"]
            assert waited_seconds >= DRAIN_TIMEOUT_SECONDS  # it waited for the drain first
            await control.wait_state(uid, "Resident", timeout_seconds=120)
            after = await http.post(
                "/v1/completions",
                json={"model": "heldgen", "prompt": "d", "max_tokens": 1, "token_seconds": 0.01},
            )
            assert after.status_code == 200, after.text
        assert triton.pid == triton_pid
        assert "ended 1 request(s) at Triton" in agent.log_tail(200_000)
