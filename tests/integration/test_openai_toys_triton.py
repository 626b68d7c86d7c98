"""OpenAI completeness with the test models behind a real Triton: a stop sequence ends a
generation the model itself does not stop (slowgen: the gateway closes its request and
Triton cancels it, which the model's trace shows), the model's own default token limit
is finish reason `length` (tinylm's too, in local mode), `usage` from the models' token counts (streamed with
`stream_options.include_usage` too), and what a model's configuration does not declare
(log-probabilities, sampling fields) is a 400 naming the field before anything reaches
the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from examples.models import reference
from tests.support.gateway_fakes import route
from tests.support.gateway_triton import Served, gateway_over_triton
from tests.support.local_up import local_up
from tests.support.waiting import until

SLOWGEN = route("slowgen", "team-a", decoupled=True)
TOKENS = route("tokens", "team-a", decoupled=True)
#: how long the model may take to notice a cancellation (one token, and Triton's own path)
NOTICE_SECONDS = 20.0


def trace(folder: Path, word: str) -> list[str]:
    path = folder / word
    return path.read_text().splitlines() if path.exists() else []


async def ended(folder: Path, word: str) -> str:
    def last() -> str | None:
        lines = trace(folder, word)
        return lines[-1] if lines and not lines[-1].startswith(("started", "token")) else None

    return await until(last, f"the generation {word!r} to stop", NOTICE_SECONDS)


def events(body: str) -> list[Any]:
    data = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_stop_usage_finish_reason_and_refusals_with_the_test_models(tmp_path: Path) -> None:
    folder = tmp_path / "trace"
    folder.mkdir()
    served = [Served(SLOWGEN, "slowgen", {"trace_dir": str(folder)}), Served(TOKENS, "tokens")]
    async with gateway_over_triton(tmp_path, served) as g, aiohttp.ClientSession() as http:
        base = g.served.url + "/ns/team-a"

        # slowgen would run to a million tokens: the stop sequence ends the answer and the
        # gateway ends the generation upstream (the model sees the request cancelled).
        body = {"model": "slowgen", "prompt": "whole a b", "stop": [" t3", "never"]}
        async with http.post(base + "/v1/completions", json=body) as r:
            answer = await r.json()
            assert r.status == 200, answer
        assert answer["choices"][0]["text"] == " t0 t1 t2"
        assert answer["choices"][0]["finish_reason"] == "stop"
        # t3 was generated (the one that held the stop), and counted
        assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        last = await ended(folder, "whole")
        assert last.startswith("cancelled") and int(last.split()[1]) < 50, last

        # The same streamed, with a stop sequence spanning two responses (" t1" " t2").
        body = {"model": "slowgen", "prompt": "streamed", "stop": "1 t", "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        async with http.post(base + "/v1/completions", json=body) as r:
            chunks = events(await r.text())
        *text_chunks, usage = chunks
        assert "".join(c["choices"][0]["text"] for c in text_chunks) == " t0 t"
        assert text_chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
        assert (await ended(folder, "streamed")).startswith("cancelled")

        # tokens: the model's default (16 words) ends the text: `length`, not `stop`.
        words = " ".join(f"w{i}" for i in range(20))
        body = {"model": "tokens", "prompt": words}
        async with http.post(base + "/v1/completions", json=body) as r:
            answer = await r.json()
        assert answer["choices"][0]["text"] == "".join(f" W{i}" for i in range(16))
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["usage"] == {"prompt_tokens": 20, "completion_tokens": 16, "total_tokens": 36}
        chat = {"model": "tokens", "messages": [{"role": "user", "content": "hi there"}],
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        async with http.post(base + "/v1/chat/completions", json=chat) as r:
            chunks = events(await r.text())
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"  # every word answered
        assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 4,
                                       "total_tokens": 8}  # fmt: skip
        body = {"model": "tokens", "prompt": "say it again", "echo": True, "max_tokens": 2}
        async with http.post(base + "/v1/completions", json=body) as r:
            answer = await r.json()
        assert answer["choices"][0]["text"] == "say it again SAY IT"

        # What the test models do not declare is refused, naming the field, and the
        # generation never starts.
        for path, body, field in [
            ("/v1/completions", {"model": "slowgen", "prompt": "never1", "logprobs": 1},
             "logprobs: model 'slowgen' cannot give it"),
            ("/v1/completions", {"model": "slowgen", "prompt": "never2", "temperature": 0.7},
             "temperature: model 'slowgen' does not take it"),
            ("/v1/chat/completions", {"model": "tokens", "messages": [
                {"role": "user", "content": "never3"}], "logprobs": True},
             "logprobs: model 'tokens' cannot give it"),
        ]:  # fmt: skip
            async with http.post(base + path, json=body) as r:
                answer = await r.json()
            assert r.status == 400, answer
            assert answer["error"]["message"].startswith(field), answer
        assert not any(trace(folder, f"never{i}") for i in (1, 2))


TINYLM_YAML = """\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: tinylm
spec:
  model:
    source: {uri: /models/tinylm}
    weightsBytes: 64Mi
    kvCacheBytes: 1Mi
  swapPolicy:
    idleAfter: never
    minResident: 1s
    onSwapOut: host
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tinylm_in_local_mode_stops_counts_and_refuses_what_it_cannot_do() -> None:
    """The issue's own case: `stop="g"` on tinylm returned the whole 16 characters; now the
    text ends before it, and the model's default 16 tokens are finish reason `length`."""
    root = Path(__file__).resolve().parents[2]
    with local_up({"tinylm.yaml": TINYLM_YAML}, root / "examples" / "models") as node:
        node.wait_phase("tinylm", "Resident", 120)
        whole = reference.tinylm_complete("hello", 16)
        r = node.post("/v1/completions", {"model": "tinylm", "prompt": "hello"})
        choice, usage = r.json()["choices"][0], r.json()["usage"]
        assert (choice["text"], choice["finish_reason"]) == (whole, "length")
        assert usage == {"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}
        cut = whole.index("g")
        for stream in (False, True):
            body = {"model": "tinylm", "prompt": "hello", "stop": "g", "stream": stream}
            r = node.post("/v1/completions", body)
            assert r.status_code == 200, r.text
            if stream:
                chunks = events(r.text)
                text = "".join(c["choices"][0]["text"] for c in chunks)
                reason = chunks[-1]["choices"][0]["finish_reason"]
            else:
                text, reason = (
                    r.json()["choices"][0]["text"],
                    r.json()["choices"][0]["finish_reason"],
                )
            assert (text, reason) == (whole[:cut], "stop")
        for field, extra in (("temperature", {"temperature": 0.2}), ("logprobs", {"logprobs": 1})):
            r = node.post("/v1/completions", {"model": "tinylm", "prompt": "hello", **extra})
            assert r.status_code == 400 and r.json()["error"]["message"].startswith(field)
