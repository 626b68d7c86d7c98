"""Which `spec.model` changes a held model cannot take in place, and the answer."""

from __future__ import annotations

from typing import Any

import pytest

from modelswap_api.models import ModelSpec
from modelswap_sidecar.agent.core.model_changes import changed_fields, refusal


def spec(**overrides: Any) -> ModelSpec:
    doc: dict[str, Any] = {
        "name": "llama",
        "runtime": "triton",
        "source": {"uri": "/models/mlp", "sha256": "a" * 64},
        "weightsBytes": "32Mi",
        "kvCacheBytes": "4Mi",
        **overrides,
    }
    return ModelSpec.from_dict(doc)


@pytest.mark.parametrize(
    ("overrides", "fields"),
    [
        ({}, ()),
        ({"name": "other", "weightsBytes": 32 << 20}, ()),  # the same bytes, written otherwise
        (
            {
                "source": {
                    "uri": "/models/mlp",
                    "sha256": "a" * 64,
                    "credentialsSecretRef": {"name": "s"},
                }
            },
            (),
        ),
        ({"source": {"uri": "/models/tinylm", "sha256": "a" * 64}}, ("spec.model.source.uri",)),
        ({"source": {"uri": "/models/mlp"}}, ("spec.model.source.sha256",)),
        (
            {"weightsBytes": "64Mi", "kvCacheBytes": None},
            ("spec.model.weightsBytes", "spec.model.kvCacheBytes"),
        ),
    ],
)
def test_changed_fields(overrides: dict[str, Any], fields: tuple[str, ...]) -> None:
    assert changed_fields(spec(), spec(**overrides)) == fields


def test_the_refusal_names_the_fields_and_the_way_out() -> None:
    answer = refusal("u-1", ("spec.model.weightsBytes",), "loaded on GPU sim-gpu-0")
    assert (answer.outcome, answer.reason) == ("conflict", "ModelChanged")
    assert answer.message is not None
    assert "spec.model.weightsBytes" in answer.message and "modelGeneration" in answer.message
    # the way out is the operator's rollout, not the agent's internal DELETE (which the
    # chart's NetworkPolicy keeps from users)
    assert "DELETE" not in answer.message
