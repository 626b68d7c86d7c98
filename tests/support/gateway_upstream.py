"""A fake Triton for the gateway's unit tests: the few v2 routes the gateway calls, on a
free loopback port, with a token stream a test paces one token at a time.

- `POST /v2/models/{m}/infer` doubles the JSON `data` of the first input (404 for a model
  not in `loaded`, as Triton answers);
- `POST /v2/models/{m}/generate_stream` sends the prompt's words upper-cased, one event
  each; with `paced` set, token i >= 1 waits until the test calls `allow(i)`;
- `GET /v2/models/{m}`, `/ready`, `/v2/health/ready`, `/v2`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web


class FakeTriton:
    def __init__(self) -> None:
        self.loaded: set[str] = set()
        self.calls: list[tuple[str, str]] = []  # (path, Host header)
        self.generate_bodies: list[dict[str, Any]] = []  # generate_stream bodies, as sent
        self.encodings: list[str | None] = []  # Content-Encoding of each request
        self.paced = False
        self.sent_tokens = 0
        self._allowed: dict[int, asyncio.Event] = {}
        self.ready = True
        self.url = ""
        #: infer requests are read, then their connection is dropped (Triton crashing)
        self.drop_infers = False
        #: fields added to a model's configuration, by Triton name (its inputs, say)
        self.configs: dict[str, dict[str, Any]] = {}

    def allow(self, index: int) -> None:
        self._allowed.setdefault(index, asyncio.Event()).set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v2/health/ready", self._server_ready)
        app.router.add_get("/v2", self._server_metadata)
        app.router.add_get("/v2/models/{m}", self._metadata)
        app.router.add_get("/v2/models/{m}/ready", self._ready)
        app.router.add_get("/v2/models/{m}/config", self._config)
        app.router.add_get("/v2/models/{m}/stats", self._stats)
        app.router.add_post("/v2/models/{m}/infer", self._infer)
        app.router.add_post("/v2/models/{m}/versions/{v}/infer", self._infer)
        app.router.add_post("/v2/models/{m}/generate_stream", self._generate_stream)
        return app

    def _model(self, request: web.Request) -> str:
        self.calls.append((request.path, request.headers.get("Host", "")))
        self.encodings.append(request.headers.get("Content-Encoding"))
        name = request.match_info["m"]
        if name not in self.loaded:
            raise web.HTTPNotFound(
                text=json.dumps({"error": f"Request for unknown model: '{name}' is not found"}),
                content_type="application/json",
            )
        return name

    async def _server_ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 400)

    async def _server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response({"name": "triton", "version": "2.51.0", "extensions": []})

    async def _metadata(self, request: web.Request) -> web.Response:
        name = self._model(request)
        return web.json_response({"name": name, "versions": ["1"], "platform": "python"})

    async def _config(self, request: web.Request) -> web.Response:
        name = self._model(request)
        parameters = {"modelswap.agent_socket": {"string_value": "/run/modelswap/agent.sock"},
                      "user_knob": {"string_value": "7"}}  # fmt: skip
        config = {"name": name, "backend": "python", "parameters": parameters}
        return web.json_response({**config, **self.configs.get(name, {})})

    async def _stats(self, request: web.Request) -> web.Response:
        name = self._model(request)
        return web.json_response({"model_stats": [{"name": name, "version": "1",
                                                   "inference_count": 3}]})  # fmt: skip

    async def _ready(self, request: web.Request) -> web.Response:
        self._model(request)
        return web.Response(status=200)

    async def _infer(self, request: web.Request) -> web.Response:
        name = self._model(request)
        if self.drop_infers:
            await request.read()
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        try:
            body = await request.json()
        except ValueError:
            return web.json_response(
                {"error": "failed to parse the request JSON buffer"}, status=400
            )
        tensor = body["inputs"][0]
        output = {**tensor, "name": "OUTPUT0", "data": [2 * v for v in tensor["data"]]}
        answer: dict[str, Any] = {"model_name": name, "model_version": "1", "outputs": [output]}
        if "id" in body:
            answer["id"] = body["id"]
        return web.json_response(answer)

    async def _generate_stream(self, request: web.Request) -> web.StreamResponse:
        name = self._model(request)
        body = await request.json()
        self.generate_bodies.append(body)
        if "text_input" not in body:
            return web.json_response(
                {"error": f"missing text_input for model '{name}'"}, status=400
            )
        limit = int(body.get("parameters", {}).get("max_tokens", 16))
        words = str(body["text_input"]).split()[:limit]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index, word in enumerate(words):
            if self.paced and index:
                await self._allowed.setdefault(index, asyncio.Event()).wait()
            if word == "FAIL":
                event = {"error": "the model broke"}
            else:
                event = {
                    "model_name": name,
                    "model_version": "1",
                    "text_output": " " + word.upper(),
                }
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
            self.sent_tokens = index + 1
        await response.write_eof()
        return response


@contextlib.asynccontextmanager
async def fake_triton(fake: Any = None) -> AsyncIterator[Any]:
    """`fake` (a `FakeTriton` by default; anything with `app()` and a `url` to set) served
    on a loopback port for the block."""
    fake = FakeTriton() if fake is None else fake
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        await runner.cleanup()
