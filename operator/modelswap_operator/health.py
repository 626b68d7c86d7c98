"""`/healthz`, `/readyz` and `/metrics` on the operator's HTTP port.

- `/healthz`: 200 while the process runs its loop (or waits for leadership), 503 once the
  loop has died;
- `/readyz`: 200 once this replica leads and its caches are complete, 503 before (a
  standby replica is alive but not ready);
- `/metrics`: Prometheus text from the operator's registry.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def health_app(
    registry: CollectorRegistry, *, alive: Callable[[], bool], ready: Callable[[], bool]
) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        del request
        return web.Response(status=200 if alive() else 503, text="ok" if alive() else "dead")

    async def readyz(request: web.Request) -> web.Response:
        del request
        return web.Response(
            status=200 if ready() else 503, text="ready" if ready() else "not ready"
        )

    async def metrics(request: web.Request) -> web.Response:
        del request
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
