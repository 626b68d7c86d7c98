from pathlib import Path

import pytest
import yaml

from modelswap_api.errors import ModelError
from modelswap_api.models import ModelDeployment, SwapNode

FOLDER = Path(__file__).resolve().parents[2] / "examples"
EXAMPLES = sorted(FOLDER.glob("*.yaml")) + sorted((FOLDER / "toy").glob("*.yaml"))
CLASSIFY = FOLDER / "toy" / "classify-drop-on-idle.yaml"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_round_trip_yaml_model_yaml_unchanged(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    model = ModelDeployment.from_dict(document)
    assert model.to_dict() == document
    assert yaml.safe_dump(model.to_dict(), sort_keys=False) == yaml.safe_dump(
        document, sort_keys=False
    )


def test_quantities_and_durations_are_parsed_and_names_default() -> None:
    model = ModelDeployment.from_dict(
        yaml.safe_load((FOLDER / "toy" / "summarize-idle-preserve-kv.yaml").read_text())
    )
    assert model.spec.model.weights_bytes.bytes == 64 << 20
    assert model.spec.swap_policy is not None and model.spec.swap_policy.idle_after is not None
    assert model.spec.swap_policy.idle_after.seconds == 20
    assert model.model_name == "summarize"  # no spec.model.name: metadata.name


def test_unknown_and_mistyped_fields_are_refused_with_their_path() -> None:
    document = yaml.safe_load(CLASSIFY.read_text())
    document["spec"]["swapPolicy"]["pinnned"] = True
    with pytest.raises(ModelError, match=r"^spec\.swapPolicy\.pinnned: unknown field"):
        ModelDeployment.from_dict(document)
    document = yaml.safe_load(CLASSIFY.read_text())
    document["spec"]["swapPolicy"]["priority"] = "high"
    with pytest.raises(ModelError, match=r"^spec\.swapPolicy\.priority: expected int"):
        ModelDeployment.from_dict(document)
    document["spec"]["swapPolicy"]["priority"] = 1
    document["spec"]["model"]["weightsBytes"] = "0Gi"
    with pytest.raises(ModelError, match=r"^spec\.model\.weightsBytes: quantity"):
        ModelDeployment.from_dict(document)


def test_swap_node_status_round_trips_with_explicit_wire_names() -> None:
    document = {
        "apiVersion": "modelswap.io/v1alpha1",
        "kind": "SwapNode",
        "metadata": {"name": "gpu-node-1"},
        "status": {
            "gpus": [
                {"uuid": "sim-0", "ordinal": 0, "link": {"kind": "sim", "hostToDeviceGBps": 7.5}}
            ],
            "nodeTaints": [{"key": "gpu", "effect": "NoSchedule"}],
        },
    }
    node = SwapNode.from_dict(document)
    assert node.status is not None and node.status.gpus is not None
    link = node.status.gpus[0].link
    assert link is not None and link.host_to_device_gbps == 7.5
    assert node.to_dict() == document
