"""`modelswap status` tells why a model is Pending or Failed, not only that it is."""

from __future__ import annotations

from modelswap_sidecar.local.status import explanations

MODELS = [
    {"name": "chat", "phase": "Failed", "reason": "LoadFailed", "message": "config.pbtxt: bad"},
    {"name": "big", "phase": "Pending", "reason": "ExceedsGpuBudget", "message": "needs 2Gi"},
    {"name": "classify", "phase": "Resident", "reason": None, "message": None},
    {"name": "quiet", "phase": "Failed"},
]


def test_each_pending_or_failed_model_gets_its_reason_and_message_in_name_order() -> None:
    assert explanations(MODELS) == [
        "big: Pending ExceedsGpuBudget: needs 2Gi",
        "chat: Failed LoadFailed: config.pbtxt: bad",
        "quiet: Failed NoReason: the agent reported no reason",
    ]


def test_serving_models_get_no_line() -> None:
    assert explanations([m for m in MODELS if m["phase"] == "Resident"]) == []
