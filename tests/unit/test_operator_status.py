"""The operator's pure parts: status and Events from verdicts and reports, entries and
credentials, routes, node liveness, settings from flags and environment."""

from __future__ import annotations

import argparse
import base64
from datetime import UTC, datetime
from typing import Any

import pytest

from modelswap_api.control import EntryResult
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import HostedModel, ModelDeployment
from modelswap_api.policy import effective_policy
from modelswap_operator import desired, routing
from modelswap_operator.command import register, settings_from
from modelswap_operator.errors import SettingsError
from modelswap_operator.reading import live_nodes
from modelswap_operator.status import Observed, Verdict, build_status
from modelswap_operator.status_events import events_between, status_changed

SPEC: dict[str, Any] = {
    "model": {"runtime": "triton", "source": {"uri": "/models/mlp"}, "weightsBytes": "32Mi"},
    "swapPolicy": {"idleAfter": "30s", "minResident": "10s", "priority": 10},
}
POLICY = effective_policy(SPEC, BUILTIN_DEFAULTS)
NOW = "2026-11-23T18:00:00Z"
UID = "2f1c8a52-7d0e-4c1b-9a57-0d1b5c3e9a10"


def deployment(**metadata: Any) -> ModelDeployment:
    meta = {"name": "classify", "namespace": "team-a", "uid": UID, "generation": 3, **metadata}
    return ModelDeployment.from_dict({"metadata": meta, "spec": SPEC})


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_a_served_model_is_ready_with_the_nodes_figures() -> None:
    hosted = HostedModel(uid="u-1", state="Resident", resident_bytes=32 << 20, host_bytes=32 << 20,
                         swap_ins=2, swap_outs=1, last_swap_in_seconds=0.05,
                         last_request_time=NOW)  # fmt: skip
    status = build_status(
        generation=3,
        deleting=False,
        verdict=Verdict(node="n1", gpu="g0", policy=POLICY, reason="Placed"),
        observed=Observed(
            node_live=True, hosted=hosted, routed=True, endpoint="classify.team-a.svc"
        ),
        previous=None,
        now=NOW,
    )
    assert status["phase"] == "Resident" and status["node"] == "n1" and status["gpu"] == "g0"
    assert status["residentBytes"] == 32 << 20 and status["swapIns"] == 2
    assert status["lastRequestTime"] == NOW and status["observedGeneration"] == 3
    assert status["effectivePolicy"]["idleAfter"] == "30s"
    assert conditions(status) == {
        "PolicyValid": ("True", "Valid"), "Placed": ("True", "Placed"),
        "Loaded": ("True", "Resident"), "Ready": ("True", "Serving"),
        "RolledOut": ("True", "Current"),
    }  # fmt: skip


def test_unplaceable_names_the_field_and_warns() -> None:
    verdict = Verdict(policy=POLICY, reason="ExceedsGpuBudget", problem_field="spec.model.weightsBytes",
                      message="64 GiB is more than any GPU's budget")  # fmt: skip
    status = build_status(generation=1, deleting=False, verdict=verdict, observed=Observed(),
                          previous=None, now=NOW)  # fmt: skip
    assert status["phase"] == "Pending" and "node" not in status
    placed = next(c for c in status["conditions"] if c["type"] == "Placed")
    assert placed["status"] == "False" and placed["reason"] == "ExceedsGpuBudget"
    assert placed["message"].startswith("spec.model.weightsBytes")
    notes = events_between(None, status)
    assert [(n.type, n.reason) for n in notes] == [("Warning", "ExceedsGpuBudget")]


def test_unsupported_runtime_and_agent_errors_are_conditions_a_user_can_act_on() -> None:
    hosted = HostedModel(uid="u-1", state="Dropped", reason="UnsupportedRuntime",
                         message="onnxruntime cannot swap in place")  # fmt: skip
    verdict = Verdict(node="n1", gpu="g0", policy=POLICY, reason="Kept")
    status = build_status(generation=1, deleting=False, verdict=verdict,
                          observed=Observed(node_live=True, hosted=hosted, routed=True),
                          previous=None, now=NOW)  # fmt: skip
    assert conditions(status)["PolicyValid"] == ("False", "UnsupportedRuntime")
    unreachable = build_status(generation=1, deleting=False, verdict=verdict,
                               observed=Observed(node_live=True, agent_error="connection refused"),
                               previous=None, now=NOW)  # fmt: skip
    assert conditions(unreachable)["Loaded"] == ("False", "AgentUnavailable")
    deferred = EntryResult(uid="u-1", outcome="deferred", reason="InsufficientHbm")
    refused = build_status(generation=1, deleting=False, verdict=verdict,
                           observed=Observed(node_live=True, push=deferred),
                           previous=None, now=NOW)  # fmt: skip
    assert conditions(refused)["Loaded"] == ("False", "InsufficientHbm")
    lost = build_status(generation=1, deleting=False, verdict=verdict, observed=Observed(),
                        previous=None, now=NOW)  # fmt: skip
    assert conditions(lost)["Ready"] == ("False", "NodeLost")


def test_transition_times_kept_while_a_condition_holds_and_no_write_when_unchanged() -> None:
    verdict = Verdict(node="n1", gpu="g0", policy=POLICY, reason="Placed")
    observed = Observed(node_live=True, hosted=HostedModel(uid="u-1", state="Resident"),
                        routed=True, endpoint="e")  # fmt: skip
    first = build_status(generation=1, deleting=False, verdict=verdict, observed=observed,
                         previous=None, now="2026-01-01T00:00:00Z")  # fmt: skip
    again = build_status(generation=1, deleting=False, verdict=verdict, observed=observed,
                         previous=first, now="2026-01-01T00:05:00Z")  # fmt: skip
    assert not status_changed(again, first)
    assert events_between(first, again) == []
    swapped = Observed(node_live=True, hosted=HostedModel(uid="u-1", state="SwappedOut"),
                       routed=True, endpoint="e")  # fmt: skip
    later = build_status(generation=1, deleting=False, verdict=verdict, observed=swapped,
                         previous=first, now="2026-01-01T00:06:00Z")  # fmt: skip
    assert status_changed(later, first) and later["phase"] == "SwappedOut"
    times = {c["type"]: c["lastTransitionTime"] for c in later["conditions"]}
    assert set(times.values()) == {"2026-01-01T00:00:00Z"}  # Loaded stayed True
    moved = build_status(generation=1, deleting=False,
                         verdict=Verdict(node="n2", gpu="g1", policy=POLICY, reason="NodeLost",
                                         message="node n1 is lost"),
                         observed=observed, previous=first, now=NOW)  # fmt: skip
    notes = events_between(first, moved)
    assert [(n.type, n.reason) for n in notes] == [("Normal", "NodeLost")]


def test_credentials_from_a_secret_strip_the_newline_and_never_show_the_value() -> None:
    def secret(value: bytes) -> dict[str, Any]:
        return {"data": {"authorization": base64.b64encode(value).decode()}}

    assert desired.credentials_from_secret(secret(b"Bearer s3cret\n"), "s").bearer_token == "s3cret"
    basic = desired.credentials_from_secret(secret(b"Basic dTpw"), "s")
    assert basic.headers == {"Authorization": "Basic dTpw"}
    for bad, expected in ((None, "does not exist"), ({"data": {}}, "no 'authorization'"),
                          (secret(b"Bearer a\nb"), "several lines"),
                          ({"data": {"authorization": "%%%"}}, "not base64")):  # fmt: skip
        with pytest.raises(ValueError, match=expected) as e:
            desired.credentials_from_secret(bad, "src")
        assert "src" in str(e.value) and "a\nb" not in str(e.value)


def test_an_entry_carries_the_policy_and_the_gpu_and_is_checked_like_the_agent_does() -> None:
    entry = desired.entry_for(deployment(), gpu="g0", policy=POLICY, credentials=None)
    assert entry.uid == UID and entry.generation == 3 and entry.gpu == "g0"
    assert entry.policy is not None and entry.policy.idle_after == "30s"
    assert desired.check_entry(entry) is None
    bad = desired.entry_for(deployment(uid="not a uid"), gpu="g0", policy=POLICY, credentials=None)
    problem = desired.check_entry(bad)
    assert problem is not None and problem.field == "metadata.uid"
    # What only the agent finds: its 400 names the entry by index.
    entries = [entry, bad]
    assert desired.refused_entry("entries[1].spec.model.weightsBytes", entries) is bad
    assert desired.refused_entry("entries[7].uid", entries) is None
    assert desired.refused_entry("revision.term", entries) is None
    assert desired.relative_field("entries[1].spec.model.weightsBytes") == "spec.model.weightsBytes"


def test_routes_point_at_the_gateway_and_names_must_be_dns_labels() -> None:
    owner = {"apiVersion": "modelswap.io/v1alpha1", "kind": "ModelDeployment",
             "name": "classify", "uid": "u-1"}  # fmt: skip
    gateway = routing.Gateway.parse("http://10.0.0.7:8080")
    assert gateway == routing.Gateway("10.0.0.7", 8080)
    service = routing.service_body("team-a", owner, gateway)
    assert service["spec"]["ports"][0]["targetPort"] == 8080 and "selector" not in service["spec"]
    slice_ = routing.endpoint_slice_body("team-a", owner, gateway, "n1", ready=True)
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "classify"
    assert slice_["endpoints"][0]["addresses"] == ["10.0.0.7"] and slice_["addressType"] == "IPv4"
    assert routing.Gateway.parse("http://[fd00::1]:80").address_type == "IPv6"  # type: ignore[union-attr]
    assert routing.endpoint_name("team-a", "classify") == "classify.team-a.svc"
    with pytest.raises(routing.RouteError, match=r"metadata\.name"):
        routing.service_name("v1.2-model")


def test_a_node_is_live_while_its_lease_is_younger_than_the_grace_period() -> None:
    def lease(seconds_ago: float) -> dict[str, Any]:
        renewed = datetime.fromtimestamp(1_000_000 - seconds_ago, UTC)
        return {"spec": {"renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}

    swapnodes = {"a": {}, "b": {}, "c": {}}
    leases = {"a": lease(1), "b": lease(100)}
    assert live_nodes(swapnodes, leases, 1_000_000, grace_seconds=90) == {"a"}


def args(*argv: str) -> argparse.Namespace:
    """`modelswap operator ARGV` as the real parser reads it."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["operator", *argv])


def test_settings_from_flags_then_environment(tmp_path: Any) -> None:
    env = {"MODELSWAP_GRACE_SECONDS": "30", "MODELSWAP_IDENTITY": "op-0",
           "MODELSWAP_NAMESPACES": "a,b"}  # fmt: skip
    settings = settings_from(args("--grace-seconds", "45"), env)
    assert settings.grace_seconds == 45 and settings.identity == "op-0"
    assert settings.namespaces == ("a", "b") and settings.push_interval_seconds == 15
    with pytest.raises(SettingsError, match="--grace-seconds"):
        settings_from(args(), {"MODELSWAP_GRACE_SECONDS": "soon"})
    with pytest.raises(SettingsError, match="exclude"):
        settings_from(args("--namespace", "a", "--all-namespaces"), {})
    bad = tmp_path / "defaults.yaml"
    bad.write_text("swapPolicy: {idleAfter: soon}\n")
    with pytest.raises(SettingsError, match="defaults"):
        settings_from(args("--defaults", str(bad)), {})


def test_json_log_lines_do_not_carry_kopfs_settings() -> None:
    import io
    import json
    import logging

    from modelswap_api.logs import configure_logging
    from modelswap_operator.command import _without_kopf_settings

    stream = io.StringIO()
    handler = configure_logging("INFO", json_lines=True, stream=stream)
    handler.addFilter(_without_kopf_settings)
    try:
        logging.getLogger("tests.kopf_like").info(  # kopf.objects posts Events itself
            "Handler succeeded.", extra={"settings": object(), "k8s_ref": {"name": "classify"}}
        )
    finally:
        logging.getLogger().removeHandler(handler)
    line = json.loads(stream.getvalue().splitlines()[-1])
    assert "settings" not in line and line["k8s_ref"] == {"name": "classify"}
