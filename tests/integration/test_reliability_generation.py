"""Generation in front of a real Triton (issue 26, item 3), with the slow generator
`tests/data/gateway_models/slowgen` (a token every `token_seconds`, up to a million unless
`max_tokens` says otherwise, checking `request.is_cancelled()` between tokens and writing
what it did to a trace file named by the prompt's first word).

- Bounds: `max_tokens` 2^70 or 100,000,000 and a prompt past `maxPromptBytes` are 400
  `GenerationBound` naming the field and the bound, before any swap-in; a generation that
  asked for no number ends after `maxTokens` responses and Triton cancels the rest.
- A client that goes away mid-generation (streaming and not, OpenAI and v2): the gateway
  closes its connection to Triton and Triton cancels the request, which the model sees at
  its next token.
- `GatewayApp.end_requests` (what an overdue swap-out drain calls): every request the model
  has at Triton is cancelled there and answered 503 `DrainDeadline` with Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.gateway_fakes import route
from tests.support.gateway_triton import Served, gateway_over_triton
from tests.support.reliability import record
from tests.support.waiting import until

MAX_TOKENS = 50
MAX_PROMPT_BYTES = 4096
SLOWGEN = dataclasses.replace(
    route("slowgen", "team-a", decoupled=True),
    max_tokens=MAX_TOKENS,
    max_prompt_bytes=MAX_PROMPT_BYTES,
)
#: how long the model may take to notice a cancellation (one token, and Triton's own path)
NOTICE_SECONDS = 20.0


def trace(folder: Path, word: str) -> list[str]:
    path = folder / word
    return path.read_text().splitlines() if path.exists() else []


async def ended(folder: Path, word: str) -> str:
    """The model's last line for the request whose prompt began with `word`, once it
    stopped (cancelled or finished)."""

    def last() -> str | None:
        lines = trace(folder, word)
        return lines[-1] if lines and not lines[-1].startswith(("started", "token")) else None

    return await until(last, f"the generation {word!r} to stop", NOTICE_SECONDS)


async def started(folder: Path, word: str) -> None:
    """Once the model sent the first token of the request whose prompt began with `word`."""
    await until(
        lambda: "token 0" in trace(folder, word),
        f"the generation {word!r} to start",
        NOTICE_SECONDS,
    )


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.trace = tmp_path / "trace"
        self.trace.mkdir()
        self.served = [Served(SLOWGEN, "slowgen", {"trace_dir": str(self.trace)})]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.asyncio
async def test_generation_bounds_refuse_before_any_swap_in_and_cap_an_unasked_length(
    tmp_path: Path,
) -> None:
    w = World(tmp_path)
    async with gateway_over_triton(tmp_path, w.served) as g, aiohttp.ClientSession() as http:
        base = g.served.url + "/ns/team-a"
        refused: list[tuple[str, str, dict[str, Any], str, str]] = [
            ("OpenAI completion max_tokens 2^70", "/v1/completions",
             {"model": "slowgen", "prompt": "a", "max_tokens": 2**70}, "max_tokens",
             f"at most {MAX_TOKENS} tokens"),
            ("OpenAI completion max_tokens 100,000,000", "/v1/completions",
             {"model": "slowgen", "prompt": "a", "max_tokens": 100_000_000}, "max_tokens",
             f"at most {MAX_TOKENS} tokens"),
            ("OpenAI chat max_completion_tokens 100,000,000", "/v1/chat/completions",
             {"model": "slowgen", "messages": [{"role": "user", "content": "a"}],
              "max_completion_tokens": 100_000_000}, "max_tokens", f"at most {MAX_TOKENS}"),
            ("OpenAI completion prompt of 1 MB", "/v1/completions",
             {"model": "slowgen", "prompt": "é" * 500_000}, "prompt",
             f"at most {MAX_PROMPT_BYTES} bytes"),
            ("OpenAI chat messages of 7 MB", "/v1/chat/completions",
             {"model": "slowgen", "messages": [{"role": "user", "content": "x" * 7_000_000}]},
             "messages", f"at most {MAX_PROMPT_BYTES} bytes"),
            ("v2 generate_stream max_tokens 2^70", "/v2/models/slowgen/generate_stream",
             {"text_input": "a", "max_tokens": 2**70}, "max_tokens", f"at most {MAX_TOKENS}"),
            ("v2 generate_stream parameters.max_tokens 100,000,000",
             "/v2/models/slowgen/generate_stream",
             {"text_input": "a", "parameters": {"max_tokens": 100_000_000}},
             "parameters.max_tokens", f"at most {MAX_TOKENS}"),
            ("v2 generate_stream text_input of 7 MB", "/v2/models/slowgen/generate_stream",
             {"text_input": "x" * 7_000_000}, "text_input", f"at most {MAX_PROMPT_BYTES} bytes"),
        ]  # fmt: skip
        for label, path, body, field, bound in refused:
            started_at = time.monotonic()
            async with http.post(base + path, json=body) as r:
                answer = await r.json(content_type=None)
                seconds = time.monotonic() - started_at
                assert r.status == 400, (label, answer)
            error = answer["error"]
            message = error["message"] if isinstance(error, dict) else error
            reason = error["code"] if isinstance(error, dict) else answer["reason"]
            assert reason == "GenerationBound", (label, answer)
            assert message.startswith(f"{field}:") and bound in message, (label, message)
            assert g.directory.swap_ins[SLOWGEN.uid] == 0, f"{label} started a swap-in"
            record(
                "inputs",
                input=f"gateway {label}",
                limit=f"spec.gateway.{'maxTokens' if 'tokens' in field else 'maxPromptBytes'}",
                outcome="400 GenerationBound naming the field and the bound, no swap-in",
                answered_seconds=round(seconds, 4),
            )

        # within the bounds: answered as asked
        async with http.post(base + "/v1/completions", json={
            "model": "slowgen", "prompt": "asked", "max_tokens": 3,
            "token_seconds": 0.001}) as r:  # fmt: skip
            answer = await r.json()
            assert r.status == 200, answer
        assert answer["choices"][0]["text"] == " t0 t1 t2"
        assert answer["choices"][0]["finish_reason"] == "length"
        assert await ended(w.trace, "asked") == "finished 3"

        # no max_tokens: the model's own default (a million) capped at maxTokens responses
        started_at = time.monotonic()
        async with http.post(base + "/v1/completions", json={
            "model": "slowgen", "prompt": "unasked"}) as r:  # fmt: skip
            answer = await r.json()
            assert r.status == 200, answer
        choice = answer["choices"][0]
        assert choice["text"] == "".join(f" t{i}" for i in range(MAX_TOKENS))
        assert choice["finish_reason"] == "length"
        assert (await ended(w.trace, "unasked")).startswith("cancelled")
        record(
            "inputs",
            input="gateway OpenAI completion without max_tokens (the model's default: 10^6)",
            limit="spec.gateway.maxTokens responses, then Triton's request cancelled",
            outcome=f"200 with {MAX_TOKENS} tokens, finish_reason length; the model stopped",
            answered_seconds=round(time.monotonic() - started_at, 4),
        )

        # the same over v2 generate_stream: the stream ends after maxTokens events
        async with http.post(
            base + "/v2/models/slowgen/generate_stream", json={"text_input": "v2unasked"}
        ) as r:
            assert r.status == 200
            events = [
                json.loads(line[len(b"data: ") :])
                for line in (await r.read()).splitlines()
                if line.startswith(b"data: ")
            ]
        assert [e["text_output"] for e in events] == [f" t{i}" for i in range(MAX_TOKENS)]
        assert (await ended(w.trace, "v2unasked")).startswith("cancelled")


async def post_then_leave(http: aiohttp.ClientSession, url: str, body: Any) -> None:
    """Send; a streaming answer: read its first line and close the connection. A whole
    answer is awaited until the caller cancels this (the connection closes then)."""
    response = await http.post(url, json=body)
    assert response.status == 200
    await response.content.readline()
    response.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.asyncio
async def test_a_client_that_goes_away_cancels_the_generation_at_triton(tmp_path: Path) -> None:
    w = World(tmp_path)
    async with gateway_over_triton(tmp_path, w.served) as g:
        base = g.served.url + "/ns/team-a"
        async with (
            aiohttp.ClientSession() as http,
            http.post(  # swapped in, warm
                base + "/v1/completions",
                json={"model": "slowgen", "prompt": "warm", "max_tokens": 1},
            ) as r,
        ):
            assert r.status == 200
        # (what, path, body, the prompt's first word: the trace's name; a chat prompt
        # begins with its first message's role)
        cases: list[tuple[str, str, dict[str, Any], str]] = [
            ("OpenAI completion, streaming", "/v1/completions",
             {"model": "slowgen", "prompt": "gone1", "stream": True}, "gone1"),
            ("OpenAI completion, not streaming", "/v1/completions",
             {"model": "slowgen", "prompt": "gone2"}, "gone2"),
            ("OpenAI chat, streaming", "/v1/chat/completions",
             {"model": "slowgen", "stream": True,
              "messages": [{"role": "user", "content": "gone3"}]}, "user:"),
            ("v2 generate_stream", "/v2/models/slowgen/generate_stream",
             {"text_input": "gone4"}, "gone4"),
        ]  # fmt: skip
        for label, path, body, word in cases:
            async with aiohttp.ClientSession() as http:
                task = asyncio.create_task(post_then_leave(http, base + path, body))
                await started(w.trace, word)
                if "stream" in path or body.get("stream"):
                    await task  # read a token, then closed the connection
                else:
                    task.cancel()  # leaves while its answer is being generated
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            left_at = time.monotonic()
            last = await ended(w.trace, word)
            seconds = time.monotonic() - left_at
            assert last.startswith("cancelled"), (label, trace(w.trace, word))
            assert int(last.split()[1]) < MAX_TOKENS, "stopped by the bound, not by its client"
            record(
                "faults",
                target=f"gateway client of a generation ({label})",
                moment="mid-generation (a token every 50 ms, no max_tokens)",
                outcome="connection to Triton closed, Triton cancelled the request, the "
                "model stopped at its next token",
                recovery_seconds=round(seconds, 3),
                answers_checked=1,
                wrong=0,
                lost_bytes=0,
            )


async def lines_of(response: aiohttp.ClientResponse) -> list[bytes]:
    return [line for line in (await response.read()).splitlines() if line]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.asyncio
async def test_ending_a_models_requests_cancels_them_at_triton_and_answers_503(
    tmp_path: Path,
) -> None:
    """What a swap-out's drain past its deadline makes the agent call."""
    w = World(tmp_path)
    async with gateway_over_triton(tmp_path, w.served) as g, aiohttp.ClientSession() as http:
        base = g.served.url + "/ns/team-a"
        plain = asyncio.create_task(
            http.post(base + "/v1/completions", json={"model": "slowgen", "prompt": "plain"})
        )
        await started(w.trace, "plain")  # swapped in by the first
        streamed = await http.post(
            base + "/v1/completions", json={"model": "slowgen", "prompt": "sse", "stream": True}
        )
        assert streamed.status == 200
        await streamed.content.readline()
        v2 = await http.post(base + "/v2/models/slowgen/generate_stream", json={"text_input": "v2"})
        assert v2.status == 200
        await v2.content.readline()
        app = g.served.app
        assert app.gateway.at_triton.count(SLOWGEN.triton_name) == 3

        ended_at = time.monotonic()
        assert app.end_requests(SLOWGEN.triton_name, "the drain waited 1 s for it") == 3
        # the whole answer not yet begun: a plain 503 with Retry-After and the reason
        async with await plain as r:
            answer = await r.json()
            assert r.status == 503 and r.headers["Retry-After"] == "1", answer
        assert answer["error"]["code"] == "DrainDeadline"
        assert answer["error"]["message"] == "the drain waited 1 s for it"
        # the streams already begun: an error event, then the end
        last = json.loads((await lines_of(streamed))[-1][len(b"data: ") :])
        assert last["error"]["code"] == "DrainDeadline", last
        streamed.close()
        v2_lines = await lines_of(v2)
        assert v2_lines[-2] == b"event: error", v2_lines[-3:]
        assert json.loads(v2_lines[-1][len(b"data: ") :])["reason"] == "DrainDeadline"
        v2.close()
        for word in ("plain", "sse", "v2"):
            assert (await ended(w.trace, word)).startswith("cancelled"), trace(w.trace, word)
        seconds = time.monotonic() - ended_at
        assert app.gateway.at_triton.count(SLOWGEN.triton_name) == 0
        counted = g.served.metric(
            "modelswap_gateway_requests_total",
            uid=SLOWGEN.uid, namespace="team-a", model="slowgen", code="503",
        )  # fmt: skip
        assert counted == 3.0

        # the model serves the next request as ever
        async with http.post(base + "/v1/completions", json={
            "model": "slowgen", "prompt": "after", "max_tokens": 2,
            "token_seconds": 0.001}) as r:  # fmt: skip
            assert r.status == 200 and (await r.json())["choices"][0]["text"] == " t0 t1"
    record(
        "faults",
        target="a swap-out's drain past drainTimeoutSeconds (GatewayApp.end_requests)",
        moment="3 generations at Triton: a whole answer, an OpenAI stream, a v2 stream",
        outcome="each cancelled at Triton (the model stopped) and answered 503 DrainDeadline "
        "(a plain 503 with Retry-After, or an error event in its stream); the next request 200",
        recovery_seconds=round(seconds, 3),
        answers_checked=4,
        wrong=0,
        lost_bytes=0,
    )
