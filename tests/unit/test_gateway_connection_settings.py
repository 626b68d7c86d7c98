"""The gateway's connection caps in the agent's settings (`gateway.maxConnections`,
`maxConnectionsPerAddress`, `reserveFileDescriptors`): read, handed to the gateway, refused
naming the field at load, and a cap that cannot fit the open-files limit refused when the
gateway starts."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.running import gateway_settings
from modelswap_sidecar.agent.settings.document import settings_from_document
from modelswap_sidecar.gateway.app import make_app, start
from modelswap_sidecar.gateway.connections import CapsError, open_files_limit
from modelswap_sidecar.gateway.settings import GatewaySettings
from tests.support.agent_documents import settings_document
from tests.support.gateway_fakes import FakeDirectory


def document(gateway: dict[str, Any]) -> dict[str, Any]:
    return settings_document(gateway={"port": 8080, **gateway})


def test_the_caps_reach_the_gateway_and_default_to_derived() -> None:
    settings = settings_from_document(
        document({"maxConnections": 3000, "maxConnectionsPerAddress": 100,
                  "reserveFileDescriptors": 2048})
    )  # fmt: skip
    given = gateway_settings(settings)
    assert (given.max_connections, given.max_connections_per_address) == (3000, 100)
    assert given.reserve_file_descriptors == 2048
    unset = gateway_settings(settings_from_document(document({})))
    assert unset.max_connections is None and unset.max_connections_per_address is None
    assert unset.reserve_file_descriptors is None


@pytest.mark.parametrize(
    ("gateway", "says"),
    [
        ({"maxConnections": 0}, "gateway.maxConnections: must be at least 1"),
        ({"maxConnections": "many"}, "gateway.maxConnections: not a whole number"),
        ({"maxConnections": 1.5}, "gateway.maxConnections: not a whole number"),
        ({"maxConnectionsPerAddress": True}, "gateway.maxConnectionsPerAddress: not a whole"),
        ({"reserveFileDescriptors": -5}, "gateway.reserveFileDescriptors: must be at least 1"),
        (
            {"maxConnections": 10, "maxConnectionsPerAddress": 11},
            "gateway.maxConnectionsPerAddress: 11 is more than gateway.maxConnections",
        ),
    ],
)
def test_a_bad_cap_is_refused_at_load_naming_it(gateway: dict[str, Any], says: str) -> None:
    with pytest.raises(SettingsError, match=says):
        settings_from_document(document(gateway))


@pytest.mark.asyncio
async def test_a_cap_past_the_open_files_limit_is_refused_when_the_gateway_starts() -> None:
    limit = open_files_limit()
    settings = GatewaySettings(
        upstream_url="http://127.0.0.1:1", host="127.0.0.1", port=0, max_connections=limit
    )
    app = make_app(FakeDirectory([]), settings, registry=CollectorRegistry())
    with pytest.raises(CapsError, match=f"gateway.maxConnections: {limit} connections"):
        await start(app)
