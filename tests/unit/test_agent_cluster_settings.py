"""The agent's cluster-mode settings (`kube`, `gpus[].linkGBps`) and the sim link figure."""

from __future__ import annotations

from typing import Any

import pytest

from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.settings.document import settings_from_document
from modelswap_sidecar.gpu.sim_link import round_gbps
from tests.support.agent_documents import settings_document as document


def test_no_kube_section_means_no_heartbeat() -> None:
    assert settings_from_document(document()).kube is None


def test_kube_section_builds_the_heartbeat_settings() -> None:
    kube = {"kubeconfig": "/etc/kube/config", "leaseNamespace": "leases",
            "holderIdentity": "pod-1", "advertiseHost": "10.0.0.5",
            "leaseDurationSeconds": 10, "renewIntervalSeconds": 2}  # fmt: skip
    settings = settings_from_document(document(kube=kube))
    assert settings.kube is not None
    assert str(settings.kube.kubeconfig) == "/etc/kube/config"
    assert settings.kube.advertise_host == "10.0.0.5"
    beat = settings.kube.heartbeat
    assert (beat.node_name, beat.lease_namespace, beat.holder) == ("node-a", "leases", "pod-1")
    assert (beat.lease_duration_seconds, beat.renew_interval_seconds) == (10, 2.0)
    in_cluster = settings_from_document(document(kube={"inCluster": True})).kube
    assert in_cluster is not None and in_cluster.kubeconfig is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"kube": {"inCluster": True}, "localMode": True}, "kube: local mode has no cluster"),
        ({"kube": {}}, "kube: set exactly one of kubeconfig and inCluster"),
        ({"kube": {"inCluster": True, "kubeconfig": "/k"}}, "kube: set exactly one"),
        ({"kube": {"inCluster": True, "renewIntervalSeconds": 30}}, "kube.renewIntervalSeconds"),
        ({"kube": "yes"}, "kube: expected a mapping"),
        ({"gpus": [{"capacityBytes": "1Gi", "linkGBps": 0}]}, r"gpus\[0\]\.linkGBps"),
    ],
)
def test_bad_cluster_settings_name_the_key(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        settings_from_document(document(**extra))


def test_link_figures_keep_two_significant_digits() -> None:
    assert [round_gbps(g) for g in (17.34, 3.456, 123.4, 0.0456, 0.0)] == [
        17.0, 3.5, 120.0, 0.046, 0.0,
    ]  # fmt: skip
