"""The control API's and the gateway's body and idle timeouts are set in the agent's
settings file (`control.` / `gateway.bodyTimeoutSeconds`, `idleTimeoutSeconds`) and reach
the servers built from it (issue 12, finding 11: they were fixed in code)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from modelswap_sidecar.agent.assembly import build
from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.running import gateway_settings
from modelswap_sidecar.agent.settings.document import settings_from_document
from modelswap_sidecar.agent.settings.values import AgentSettings


def agent_settings(tmp_path: Path, **extra: Any) -> AgentSettings:
    doc = {
        "nodeName": "node-a",
        "allocator": "sim",
        "gpus": [{"uuid": "sim-gpu-0", "capacityBytes": "64Mi", "linkGBps": 10}],
        "hostStore": {"dir": str(tmp_path / "store"), "capacityBytes": "64Mi"},
        "socketDir": str(tmp_path / "sock"),
        "stateDir": str(tmp_path / "state"),
        "sourceCache": {"dir": str(tmp_path / "cache")},
        "triton": {"url": "127.0.0.1:9", "repository": str(tmp_path / "repo")},
        **extra,
    }
    doc["control"] = {"tokenFile": str(tmp_path / "token"), **doc.get("control", {})}
    return settings_from_document(doc)


def test_the_defaults_are_the_servers_own(tmp_path: Path) -> None:
    settings = agent_settings(tmp_path)
    gateway = gateway_settings(settings)
    assert (gateway.body_timeout_seconds, gateway.idle_timeout_seconds) == (60.0, 75.0)
    assert (settings.control_body_timeout_seconds, settings.control_idle_timeout_seconds) == (
        30.0,
        75.0,
    )


def test_set_in_the_file_they_reach_the_control_api_and_the_gateway(tmp_path: Path) -> None:
    settings = agent_settings(
        tmp_path,
        control={"bodyTimeoutSeconds": 5, "idleTimeoutSeconds": 7},
        gateway={"port": 0, "bodyTimeoutSeconds": 11, "idleTimeoutSeconds": 13},
    )
    gateway = gateway_settings(settings)
    assert (gateway.body_timeout_seconds, gateway.idle_timeout_seconds) == (11.0, 13.0)

    async def built() -> tuple[float, float]:
        async with contextlib.AsyncExitStack() as stack:
            agent = await build(settings, stack)
            control = agent.service.settings
            return control.body_timeout_seconds, control.idle_timeout_seconds

    assert asyncio.run(built()) == (5.0, 7.0)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"control": {"bodyTimeoutSeconds": 0}}, "control.bodyTimeoutSeconds: must be positive"),
        ({"gateway": {"idleTimeoutSeconds": "soon"}}, "gateway.idleTimeoutSeconds: not a number"),
    ],
)
def test_a_bad_timeout_is_refused_naming_the_key(
    tmp_path: Path, extra: dict[str, Any], named: str
) -> None:
    with pytest.raises(SettingsError, match=named):
        agent_settings(tmp_path, **extra)
