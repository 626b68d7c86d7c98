"""`modelswap uninstall` (operator/modelswap_operator/uninstall.py) against the emulator,
as the cluster admin: the operator's Lease decides whether it goes ahead; each model is
marked, its finalizer removed and only our routes deleted; a second run changes nothing;
a Lease still held past the wait refuses with a message and changes nothing. The chart's
hook running it under `helm uninstall` is tests/integration/test_chart_uninstall.py."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from modelswap_api import kube
from modelswap_operator.uninstall import (
    Target,
    Uninstaller,
    UninstallError,
    finalizers_without_ours,
    live_holder,
    uninstalled_conditions,
)
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import api_client
from tests.support.operator_world import OPERATOR_NAMESPACE, emulator

GROUP, VERSION = "modelswap.io", "v1alpha1"
FINALIZER = "modelswap.io/finalizer"
NOW = datetime.datetime(2026, 11, 27, 12, 0, tzinfo=datetime.UTC)
TARGET = Target(operator_namespace=OPERATOR_NAMESPACE, operator_deployment="op",
                leader_lease="modelswap-operator", wait_seconds=0.3)  # fmt: skip


def lease(
    holder: str | None, renewed: datetime.datetime, duration_seconds: int = 15
) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseDurationSeconds": duration_seconds,
                            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}  # fmt: skip
    if holder is not None:
        spec["holderIdentity"] = holder
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "modelswap-operator", "namespace": OPERATOR_NAMESPACE},
            "spec": spec}  # fmt: skip


# -- decisions ------------------------------------------------------------------------------------


def test_a_lease_is_held_only_by_a_named_holder_within_its_duration() -> None:
    assert live_holder(None, NOW) is None
    assert live_holder(lease(None, NOW), NOW) is None  # released
    assert live_holder(lease("op-1", NOW - datetime.timedelta(seconds=5)), NOW) == "op-1"
    assert live_holder(lease("op-1", NOW - datetime.timedelta(seconds=16)), NOW) is None
    unjudgeable = {"spec": {"holderIdentity": "op-1"}}
    assert live_holder(unjudgeable, NOW) == "op-1"  # no renewal time: taken as held


def test_only_our_finalizer_goes_and_ready_becomes_false() -> None:
    model = {"metadata": {"finalizers": ["other.io/keep", FINALIZER]}}
    assert finalizers_without_ours(model) == ["other.io/keep"]
    assert finalizers_without_ours({"metadata": {"finalizers": ["other.io/keep"]}}) is None
    status = {"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "Resident", "observedGeneration": 3,
         "lastTransitionTime": "2026-11-27T10:00:00Z"},
        {"type": "Scheduled", "status": "True", "reason": "Placed"},
    ]}}  # fmt: skip
    ready, scheduled = uninstalled_conditions(status, "2026-11-27T12:00:00Z")
    assert ready == {"type": "Ready", "status": "False", "reason": "OperatorUninstalled",
                     "message": "modelswap was uninstalled: nothing serves this model",
                     "lastTransitionTime": "2026-11-27T12:00:00Z", "observedGeneration": 3}  # fmt: skip
    assert scheduled["type"] == "Scheduled"
    (added,) = uninstalled_conditions({}, "2026-11-27T12:00:00Z")
    assert added["status"] == "False"


# -- against the emulator -------------------------------------------------------------------------


@pytest.fixture
def api() -> Iterator[EmulatorThread]:
    with emulator() as api:
        yield api


def model(name: str, finalizers: list[str]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": "default", "finalizers": finalizers},
            "spec": {"model": {"source": {"uri": "/models/mlp"}, "weightsBytes": "1Mi"}}}  # fmt: skip


def route(kind: str, name: str, ours: bool) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "modelswap"} if ours else {"team": "theirs"}
    metadata = {"name": name, "namespace": "default", "labels": labels}
    if kind == "Service":
        return {"apiVersion": "v1", "kind": "Service", "metadata": metadata,
                "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}  # fmt: skip
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": metadata,
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}]}  # fmt: skip


def seed(api: EmulatorThread) -> None:
    api.create({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "op", "namespace": OPERATOR_NAMESPACE},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"a": "b"}},
                         "template": {"metadata": {"labels": {"a": "b"}},
                                      "spec": {"containers": [{"name": "c", "image": "i"}]}}}})  # fmt: skip
    api.create(model("ours", ["other.io/keep", FINALIZER]))
    api.create(model("plain", []))
    api.create(route("Service", "ours", ours=True))
    api.create(route("EndpointSlice", "ours-modelswap", ours=True))
    api.create(route("Service", "plain", ours=False))  # someone else's of the same name


def test_uninstall_releases_models_deletes_only_our_routes_and_runs_again(
    api: EmulatorThread,
) -> None:
    seed(api)
    api.create(lease(None, NOW))  # released by the stopped operator
    with api_client(api.kubeconfig_path) as admin:
        report = Uninstaller(admin, TARGET).run()
        assert (report.models, report.finalizers_removed, report.routes_deleted) == (2, 1, 2)
        apps = client.AppsV1Api(admin)
        assert apps.read_namespaced_deployment("op", OPERATOR_NAMESPACE).spec.replicas == 0
        ours = kube.read_model_deployment(admin, "default", "ours") or {}
        assert ours["metadata"]["finalizers"] == ["other.io/keep"]
        conditions = {c["type"]: c for c in ours["status"]["conditions"]}
        assert conditions["Ready"]["reason"] == "OperatorUninstalled"
        assert ours["status"]["phase"] == "Unknown"  # not a phase the Ready=False denies
        assert kube.read_service(admin, "default", "ours") is None
        assert kube.read_endpoint_slice(admin, "default", "ours-modelswap") is None
        assert kube.read_service(admin, "default", "plain") is not None  # not ours: kept

        again = Uninstaller(admin, TARGET).run()  # a retried Job
        assert (again.models, again.finalizers_removed, again.routes_deleted) == (2, 0, 0)


def test_a_lease_still_held_refuses_with_the_holder_named_and_changes_no_model(
    api: EmulatorThread,
) -> None:
    seed(api)
    api.create(lease("op-7d9-x", datetime.datetime.now(datetime.UTC), duration_seconds=600))
    with api_client(api.kubeconfig_path) as admin:
        uninstaller = Uninstaller(admin, TARGET, poll_seconds=0.05)
        with pytest.raises(UninstallError, match="'op-7d9-x' still holds the leader Lease"):
            uninstaller.run()
        ours = kube.read_model_deployment(admin, "default", "ours") or {}
        assert FINALIZER in ours["metadata"]["finalizers"]
        assert kube.read_service(admin, "default", "ours") is not None


def test_the_command_names_a_missing_flag_and_fails_on_a_held_lease(
    api: EmulatorThread, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from modelswap_api.cli import main

    monkeypatch.delenv("MODELSWAP_OPERATOR_NAMESPACE", raising=False)
    assert main(["uninstall", "--release", "ms"]) == 2
    assert "--operator-namespace" in capsys.readouterr().err
    seed(api)
    api.create(lease("op-1", datetime.datetime.now(datetime.UTC), duration_seconds=600))
    code = main(["uninstall", "--kubeconfig", str(api.kubeconfig_path), "--operator-namespace",
                 OPERATOR_NAMESPACE, "--operator-deployment", "op", "--wait-seconds", "0"])  # fmt: skip
    assert code == 1


def test_the_command_refuses_a_bad_name_and_a_missing_kubeconfig_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    from modelswap_api.cli import main

    odd = "a\x1b]0;pwn\x07"
    assert main(["uninstall", "--release", odd, "--operator-namespace", "ns"]) == 2
    err = capsys.readouterr().err
    assert "--release: 'a\\x1b]0;pwn\\x07' is not a valid name" in err and "\x1b" not in err
    missing = str(tmp_path / "nowhere")
    code = main(["uninstall", "--release", "ms", "--operator-namespace", "ns",
                 "--kubeconfig", missing])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"modelswap uninstall: cannot use {missing}:") and "Traceback" not in err
