"""The contract against a real API server: opt-in with MODELSWAP_E2E_KUBECONFIG.

The CRDs are applied, every example is accepted and every invalid file refused by a
server-side dry run (nothing is stored), naming the same field our validator names.
"""

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBECONFIG = os.environ.get("MODELSWAP_E2E_KUBECONFIG")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not KUBECONFIG, reason="needs a cluster: set MODELSWAP_E2E_KUBECONFIG"),
]


@pytest.fixture(scope="module")
def api() -> Any:
    from kubernetes import client

    from modelswap_api import kube

    api_client = kube.api_client(KUBECONFIG)
    extensions = client.ApiextensionsV1Api(api_client)
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        try:
            extensions.create_custom_resource_definition(crd)
        except client.ApiException as e:
            if e.status != 409:
                raise
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = extensions.read_custom_resource_definition(crd["metadata"]["name"]).status
            if any(c.type == "Established" and c.status == "True" for c in status.conditions or []):
                break
            time.sleep(0.5)
    return kube.custom_objects(api_client)


def create_dry_run(api: Any, document: dict[str, Any]) -> None:
    api.create_namespaced_custom_object(
        "modelswap.io",
        "v1alpha1",
        document["metadata"].get("namespace", "default"),
        "modeldeployments",
        document,
        dry_run="All",
        field_validation="Strict",
    )


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "examples").glob("*.yaml")) + sorted((ROOT / "examples" / "toy").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_examples_are_accepted(api: Any, path: Path) -> None:
    create_dry_run(api, yaml.safe_load(path.read_text()))


@pytest.mark.parametrize(
    "path", sorted((ROOT / "tests/data/invalid").glob("*.yaml")), ids=lambda p: p.stem
)
def test_invalid_files_are_refused_naming_the_field(api: Any, path: Path) -> None:
    from kubernetes import client

    expected = re.search(r"^# expect: (\S+)$", path.read_text(), re.MULTILINE)
    assert expected
    with pytest.raises(client.ApiException) as caught:
        create_dry_run(api, yaml.safe_load(path.read_text()))
    assert caught.value.status in (400, 422)
    assert expected.group(1) in str(caught.value.body)
