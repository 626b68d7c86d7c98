"""The SwapNode report's pure parts: the last-request time in steps, bounded texts, and the
hosted-model fields the operator reads, checked against the SwapNode CRD's schema."""

from __future__ import annotations

import dataclasses
from typing import Any

from modelswap_api import codec, crds
from modelswap_api.models import HostedModel, SwapNodeStatus
from modelswap_api.validation import SchemaValidator
from modelswap_sidecar.agent.ports.node_report import (
    LAST_REQUEST_STEP_SECONDS,
    MAX_MESSAGE_CHARS,
    RequestTimeSteps,
    bounded,
)


def status_schema() -> dict[str, Any]:
    version = crds.version_of(crds.crd_for(crds.SWAP_NODE), crds.VERSION)
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def test_steady_traffic_moves_the_shown_request_time_once_per_step() -> None:
    steps = RequestTimeSteps()
    start = 1_700_000_000.0
    shown = [steps.shown("m", start + t) for t in range(0, 31)]  # a request every second
    assert sorted({s for s in shown if s is not None}) == [start + t for t in (0, 10, 20, 30)]
    assert LAST_REQUEST_STEP_SECONDS == 10
    # An earlier time (a restarted count) is taken at once; no time forgets the model.
    assert steps.shown("m", start + 5) == start + 5
    assert steps.shown("m", None) is None
    assert steps.shown("m", start + 6) == start + 6


def test_models_no_longer_held_are_forgotten() -> None:
    steps = RequestTimeSteps(step_seconds=10)
    steps.shown("a", 100.0)
    steps.shown("b", 100.0)
    steps.keep_only(["b"])
    assert steps.shown("a", 105.0) == 105.0  # forgotten: taken as new
    assert steps.shown("b", 105.0) == 100.0


def test_texts_are_cut_to_the_crd_bounds() -> None:
    assert bounded("", 10) is None and bounded(None, 10) is None
    assert bounded("short", 10) == "short"
    cut = bounded("x" * 5000, MAX_MESSAGE_CHARS)
    assert cut is not None and len(cut) == MAX_MESSAGE_CHARS and cut.endswith("…")


def test_every_hosted_model_field_is_in_the_swapnode_schema_and_a_full_one_validates() -> None:
    schema = status_schema()
    items = schema["properties"]["models"]["items"]
    wire = {codec.wire_name(f) for f in dataclasses.fields(HostedModel)}
    assert wire == set(items["properties"])
    for name, node in items["properties"].items():
        if node["type"] == "string":
            assert "maxLength" in node, name
    status_wire = {codec.wire_name(f) for f in dataclasses.fields(SwapNodeStatus)}
    assert status_wire == set(schema["properties"])

    model = HostedModel(
        uid="0b6e0d2e-1b7c-4a44-8f4e-0d3c1f0a9b11",
        namespace="team-a",
        name="llama",
        state="SwappedOut",
        gpu="GPU-1",
        resident_bytes=0,
        generation=3,
        desired=False,
        host_bytes=32 << 20,
        swap_ins=4,
        swap_outs=5,
        last_swap_in_seconds=0.31,
        last_request_time="2026-11-22T18:00:00.125Z",
        reason="LoadFailed",
        message=bounded("x" * 5000, MAX_MESSAGE_CHARS),
    )
    result = SchemaValidator(schema).validate(SwapNodeStatus(models=(model,)).to_dict())
    assert not result.errors and not result.unknown_fields
    assert HostedModel.from_dict(model.to_dict()) == model
    too_long = dataclasses.replace(model, message="x" * (MAX_MESSAGE_CHARS + 1))
    result = SchemaValidator(schema).validate(SwapNodeStatus(models=(too_long,)).to_dict())
    assert [e.path for e in result.errors] == ["models[0].message"]
