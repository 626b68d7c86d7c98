"""The gateway in front of a real Triton: models from `tests/data/gateway_models`, a
`FakeDirectory` whose swap-in is a real Triton load (held until the test releases it)."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.triton.config import ModelswapParameters
from tests.support.gateway_fakes import FakeDirectory, ServedGateway, served_gateway
from tests.support.triton_server import ROOT, RunningTriton, running_triton

GATEWAY_MODELS = ROOT / "tests" / "data" / "gateway_models"


@dataclass(frozen=True)
class Served:
    route: ModelRoute
    model: str  # a folder of tests/data/gateway_models
    extra: Mapping[str, str] | None = None


@dataclass
class GatewayOverTriton:
    triton: RunningTriton
    directory: FakeDirectory
    served: ServedGateway


@contextlib.asynccontextmanager
async def gateway_over_triton(
    tmp_path: Path, models: Sequence[Served], **settings: Any
) -> AsyncIterator[GatewayOverTriton]:
    """Real Triton with nothing loaded: every model starts swapped out, and its swap-in
    loads it into Triton."""
    by_uid = {m.route.uid: m for m in models}
    async with running_triton(tmp_path) as triton:
        directory = FakeDirectory([m.route for m in models])

        async def load(uid: str) -> None:
            served = by_uid[uid]
            source = tmp_path / "sources" / f"{served.model}-{uuid.uuid4().hex[:8]}"
            shutil.copytree(GATEWAY_MODELS / served.model, source)
            parameters = ModelswapParameters(
                uid=uid,
                gpu_ordinal=0,
                weights_bytes=1 << 20,
                kv_cache_bytes=0,
                agent_socket=str(tmp_path / "agent.sock"),
                extra=dict(served.extra or {}),
            )
            await triton.driver.load(uid, source, parameters)

        directory.action = load
        async with served_gateway(directory, triton.process.http_url, **settings) as served:
            yield GatewayOverTriton(triton, directory, served)
