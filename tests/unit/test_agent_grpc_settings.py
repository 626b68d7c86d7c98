"""The agent's `gateway.grpcPort` and `triton.grpcUrl`: the gateway's gRPC front is on only
with both, and a port without Triton's gRPC address is refused naming the fields."""

from __future__ import annotations

import pytest

from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.settings.document import settings_from_document
from tests.support.agent_documents import settings_document

TRITON = {"url": "127.0.0.1:8000", "repository": "/tmp/repo"}


def test_grpc_front_is_off_unless_a_port_is_set() -> None:
    settings = settings_from_document(settings_document(gateway={"port": 8080}))
    assert settings.gateway_grpc_port == 0 and settings.triton.grpc_url is None
    zero = settings_from_document(settings_document(gateway={"port": 8080, "grpcPort": 0}))
    assert zero.gateway_grpc_port == 0


def test_grpc_port_and_triton_grpc_url_are_read() -> None:
    settings = settings_from_document(
        settings_document(
            gateway={"port": 8080, "grpcPort": 8081},
            triton={**TRITON, "grpcUrl": "127.0.0.1:8001"},
        )
    )
    assert settings.gateway_grpc_port == 8081
    assert settings.triton.grpc_url == "127.0.0.1:8001"


def test_a_grpc_port_without_tritons_grpc_url_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"gateway.grpcPort needs triton.grpcUrl"):
        settings_from_document(settings_document(gateway={"port": 8080, "grpcPort": 8081}))
