"""The KV report a model process's heartbeat carries: what the agent takes (counts only),
what it sums over a model's instances, and the metrics it becomes."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from modelswap_sidecar.engine.records import KV_REPORT_MAX, KvReport
from modelswap_sidecar.metrics import ModelLabels, ModelSample, NodeMetrics, NodeSample

LABELS = {"uid": "u-1", "namespace": "team-a", "model": "llama"}
DOC = {
    "sessions": 2,
    "device_blocks": 12,
    "host_blocks": 5,
    "hits": 7,
    "misses": 3,
    "evictions": 1,
    "tokens_reused": 900,
    "tokens_recomputed": 40,
}


def test_a_report_is_taken_with_missing_figures_zero_and_unknown_ones_left_out() -> None:
    assert KvReport.from_doc(DOC) == KvReport(**DOC)
    assert KvReport.from_doc({"hits": 1, "later_figure": 5}) == KvReport(hits=1)
    assert KvReport.from_doc({}) == KvReport()
    assert KvReport.from_doc({"hits": KV_REPORT_MAX}) == KvReport(hits=KV_REPORT_MAX)


@pytest.mark.parametrize(
    "doc",
    [
        None,
        [1, 2],
        "hits=1",
        {"hits": -1},
        {"hits": KV_REPORT_MAX + 1},
        {"hits": True},
        {"hits": 1.5},
        {"hits": "3"},
    ],
    ids=["none", "list", "string", "negative", "huge", "bool", "float", "text"],
)
def test_a_doc_that_is_not_a_report_is_refused(doc: Any) -> None:
    assert KvReport.from_doc(doc) is None


def test_instances_reports_add_up() -> None:
    total = KvReport(**DOC) + KvReport(hits=1, device_blocks=3)
    assert total.hits == 8 and total.device_blocks == 15 and total.tokens_reused == 900
    assert total.as_doc()["hits"] == 8


def test_the_report_becomes_the_models_kv_metrics() -> None:
    registry = CollectorRegistry()
    sample = NodeSample(
        models=[
            ModelSample(
                model=ModelLabels(uid="u-1", namespace="team-a", name="llama"),
                state="Resident",
                resident_bytes=1,
                host_bytes=1,
                kv_device_blocks=12,
                kv_host_blocks=5,
                kv_hits=7,
                kv_misses=3,
                kv_evictions=1,
                kv_tokens_reused=900,
                kv_tokens_recomputed=40,
            )
        ]
    )
    NodeMetrics(registry, lambda: sample)
    value = registry.get_sample_value
    assert value("modelswap_kv_blocks", {**LABELS, "tier": "device"}) == 12
    assert value("modelswap_kv_blocks", {**LABELS, "tier": "host"}) == 5
    assert value("modelswap_kv_session_hits_total", LABELS) == 7
    assert value("modelswap_kv_session_misses_total", LABELS) == 3
    assert value("modelswap_kv_session_evictions_total", LABELS) == 1
    assert value("modelswap_kv_tokens_reused_total", LABELS) == 900
    assert value("modelswap_kv_tokens_recomputed_total", LABELS) == 40


def test_a_heartbeat_keeps_the_last_valid_report_and_drops_one_that_is_not() -> None:
    from modelswap_api.wire import Message, Op
    from modelswap_sidecar.engine.protocol import ClientProtocol
    from modelswap_sidecar.engine.records import InstanceRecord, ModelConfig, ModelRecord

    inst = InstanceRecord("i0")
    model = ModelRecord(ModelConfig("m", 0))

    def beat(body: dict[str, Any]) -> None:
        ClientProtocol._take_kv_report(model, inst, Message(Op.HEARTBEAT, 1, 1, body, []))

    beat({"kv": DOC})
    assert inst.kv_report == KvReport(**DOC)
    beat({"kv": {"hits": -5}})  # not a report: the last one stays
    assert inst.kv_report == KvReport(**DOC)
    beat({})  # a heartbeat without one changes nothing
    assert inst.kv_report == KvReport(**DOC)
