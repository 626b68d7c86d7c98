"""What a node pod gives the agent beyond the shared settings file: its node name, pod IP
and pod name as `modelswap sidecar` flags (one ConfigMap serves every node), and one HBM
reserve for GPUs the chart cannot name by UUID."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelswap_sidecar.agent import command
from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.settings.document import load_settings, settings_from_document
from tests.support.agent_documents import settings_document


def document(**extra: Any) -> dict[str, Any]:
    """Without `nodeName` unless given: the pod's NODE_NAME stands for it."""
    doc = settings_document(**extra)
    if "nodeName" not in extra:
        del doc["nodeName"]
    return doc


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    return parser.parse_args(["sidecar", *argv])


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {key: getattr(args, attr) for attr, key in command._OVERRIDES.items()}


def test_pod_flags_fill_the_kube_section(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump(document(kube={"inCluster": True})))
    args = parse(["--config", str(config), "--node-name", "gpu-7",
                  "--advertise-host", "10.1.2.3", "--holder-identity", "modelswap-node-x1"])  # fmt: skip
    settings = load_settings(args.config, overrides(args))
    assert settings.node_name == "gpu-7"
    assert settings.kube is not None
    assert settings.kube.advertise_host == "10.1.2.3"
    beat = settings.kube.heartbeat
    assert (beat.node_name, beat.holder) == ("gpu-7", "modelswap-node-x1")


def test_without_the_flags_the_file_decides(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    kube = {"inCluster": True, "advertiseHost": "node-a.example", "holderIdentity": "h"}
    config.write_text(yaml.safe_dump(document(nodeName="node-a", kube=kube)))
    args = parse(["--config", str(config)])
    settings = load_settings(args.config, overrides(args))
    assert settings.kube is not None
    assert settings.kube.advertise_host == "node-a.example"
    assert settings.kube.heartbeat.holder == "h"


def test_a_kube_flag_without_a_kube_section_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump(document(nodeName="node-a")))
    args = parse(["--config", str(config), "--advertise-host", "10.1.2.3"])
    with pytest.raises(SettingsError, match=r"kube\.advertiseHost: .*no kube section"):
        load_settings(args.config, overrides(args))


def test_gpu_reserve_applies_where_no_entry_sets_its_own() -> None:
    gpus = [{"uuid": "a", "capacityBytes": "1Gi"},
            {"uuid": "b", "capacityBytes": "1Gi", "reserveBytes": "64Mi"}]  # fmt: skip
    settings = settings_from_document(document(nodeName="n", gpus=gpus, gpuReserveBytes="128Mi"))
    assert [g.reserve_bytes for g in settings.gpus] == [128 << 20, 64 << 20]
    assert settings.gpu_reserve_bytes == 128 << 20
    assert settings_from_document(document(nodeName="n")).gpu_reserve_bytes == 0


def test_a_bad_gpu_reserve_names_the_key() -> None:
    with pytest.raises(SettingsError, match="gpuReserveBytes"):
        settings_from_document(document(nodeName="n", gpuReserveBytes="lots"))
