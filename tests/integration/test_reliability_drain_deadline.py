"""A swap-out's drain that outlasts `policy.drainTimeoutSeconds` ends the model's requests,
not the swap-out (issue 26, item 3), through the real agent, gateway and Triton.

`tests/data/gateway_models/heldgen` generates a token every 50 ms inside `in_use()` (up to
a million: as long as its client reads), so a swap-out's drain waits for it. Before, the
drain timed out, the swap-out rolled back (the model stayed `SwappingOut` for the whole
timeout, then came back, and was retried), and the generation went on. Now, at the
deadline, the agent's gateway cancels the model's requests at Triton: the client gets an
error event `DrainDeadline` in its stream, the model sees `is_cancelled()`, leaves
`in_use()`, and the swap-out completes; the next request swaps the model back in.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.agent_harness import (
    EXAMPLES,
    ROOT,
    AgentConfig,
    _free_port,
    entry,
    new_uid,
    node,
)
from tests.support.reliability import record

DRAIN_TIMEOUT_SECONDS = 2.0
TEST_MODELS = ROOT / "tests" / "data" / "gateway_models"


def heldgen_entry(uid: str) -> dict[str, Any]:
    return entry(uid, model="heldgen", weights="1Mi", source={"uri": "/testmodels/heldgen"})


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.asyncio
async def test_a_drain_past_its_deadline_ends_the_generation_and_the_swap_out_completes(
    tmp_path: Path,
) -> None:
    gateway_port = _free_port()
    config = AgentConfig(
        extra={
            "modelRoots": {"/models": str(EXAMPLES), "/testmodels": str(TEST_MODELS)},
            "gateway": {"host": "127.0.0.1", "port": gateway_port},
            "policy": {
                "intervalSeconds": 0.25,
                "retryFailedSeconds": 60.0,
                "drainTimeoutSeconds": DRAIN_TIMEOUT_SECONDS,
            },
        }
    )
    async with node(tmp_path, config) as n:
        uid = new_uid()
        results = await n.control.desired([heldgen_entry(uid)])
        assert results[uid]["outcome"] == "applied", results
        await n.control.wait_state(uid, "Resident", timeout_seconds=90)
        base = f"http://127.0.0.1:{gateway_port}/ns/default"
        async with httpx.AsyncClient(timeout=60.0, trust_env=False) as http:
            body = {"model": "heldgen", "prompt": "a", "stream": True}
            async with http.stream("POST", base + "/v1/completions", json=body) as stream:
                assert stream.status_code == 200
                lines = stream.aiter_lines()
                first = await anext(lines)
                assert json.loads(first[len("data: ") :])["choices"][0]["text"] == " t0"

                started = time.monotonic()
                out = await n.control.swap(uid, "out")  # drains: the generation holds it
                swap_seconds = time.monotonic() - started
                assert out.status_code == 200, out.text
                assert (await n.control.model(uid))["state"] == "SwappedOut"
                assert swap_seconds >= DRAIN_TIMEOUT_SECONDS  # it waited for the drain
                rest = [line async for line in lines if line.startswith("data: ")]
            error = json.loads(rest[-1][len("data: ") :])["error"]
            assert error["code"] == "DrainDeadline", rest[-3:]
            assert "drainTimeoutSeconds" in error["message"]

            # the next request swaps the model back in and is answered
            again = await http.post(
                base + "/v1/completions",
                json={"model": "heldgen", "prompt": "b", "max_tokens": 3, "token_seconds": 0.001},
            )
            assert again.status_code == 200, again.text
            assert again.json()["choices"][0]["text"] == " t0 t1 t2"
            assert (await n.control.model(uid))["state"] == "Resident"
        assert "ended 1 request(s) at Triton" in n.agent.log_tail(20000)
    record(
        "faults",
        target="a generation holding a manual swap-out's drain (drainTimeoutSeconds 2 s)",
        moment="streaming, a token every 50 ms, no max_tokens",
        outcome="at the deadline the gateway ended it (DrainDeadline event, Triton cancelled "
        "it) and the swap-out completed; the next request swapped the model back in, 200",
        recovery_seconds=round(swap_seconds, 3),
        answers_checked=2,
        wrong=0,
        lost_bytes=0,
    )
