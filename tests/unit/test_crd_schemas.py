"""The CRDs are structural, pass kubernetes-validate --strict, and their CEL rules are sound."""

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelswap_api import crds
from modelswap_api.cel import compile_rule
from modelswap_api.defaults import POLICY_SECTIONS

ROOT = Path(__file__).resolve().parents[2]
CRD_FILES = sorted((ROOT / "crds").glob("*.yaml"))
ALL = crds.load_crds()


def schema_of(kind: str) -> dict[str, Any]:
    return dict(crds.version_of(ALL[kind], crds.VERSION)["schema"]["openAPIV3Schema"])


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[*]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{*}}")


def test_kubernetes_validate_strict_accepts_the_crds() -> None:
    bin_dir = Path(sys.executable).parent
    result = subprocess.run(
        [str(bin_dir / "kubernetes-validate"), "--strict", *map(str, CRD_FILES)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Couldn't find schema" not in output and "WARN" not in output, output
    assert output.count("passed") == len(CRD_FILES), output


@pytest.mark.parametrize("kind", sorted(ALL))
def test_schemas_are_structural(kind: str) -> None:
    for path, node in walk(schema_of(kind)):
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
        else:
            assert node.get("type") in {
                "object",
                "array",
                "string",
                "integer",
                "number",
                "boolean",
            }, path
        assert not ("properties" in node and "additionalProperties" in node), path
        # Only the root's metadata is an object without properties (ObjectMeta is the API's).
        if (
            node.get("type") == "object"
            and "properties" not in node
            and "additionalProperties" not in node
        ):
            assert path == ".metadata", f"{path} would prune everything under it"
        assert "x-kubernetes-preserve-unknown-fields" not in node, path


@pytest.mark.parametrize("kind", sorted(ALL))
def test_every_field_has_a_description_or_is_obvious(kind: str) -> None:
    spec = schema_of(kind)["properties"]
    for path, node in walk(spec.get("spec", {}), ".spec"):
        if path.endswith(("[*]", "{*}")):
            continue
        assert node.get("description"), f"{kind}{path} has no description"


def test_policy_fields_carry_no_schema_defaults() -> None:
    spec = schema_of(crds.MODEL_DEPLOYMENT)["properties"]["spec"]
    for section in POLICY_SECTIONS:
        for path, node in walk(spec["properties"][section], section):
            assert "default" not in node, path


def test_every_cel_rule_compiles_and_reads_only_bounded_inputs() -> None:
    count = 0
    for kind in ALL:
        for path, node in walk(schema_of(kind)):
            for entry in node.get("x-kubernetes-validations", ()):
                rule = compile_rule(entry, path)
                count += 1
                assert rule.message and rule.field_path.startswith("."), (path, entry)
                for name in rule.fields_read:
                    child = node["properties"][name]
                    bounded = {"string": "maxLength", "array": "maxItems"}
                    needed = bounded.get(child.get("type", ""))
                    if "additionalProperties" in child:  # a map, not a struct
                        needed = "maxProperties"
                    if needed and not (needed == "maxLength" and "enum" in child):
                        assert needed in child, (
                            f"{path}.{name} is read by {rule.rule!r} but has no {needed}"
                        )
    assert count >= 5


def test_durations_admit_never_and_quantities_refuse_what_the_issue_lists() -> None:
    spec = schema_of(crds.MODEL_DEPLOYMENT)["properties"]["spec"]
    quantities = [n for _, n in walk(spec) if n.get("x-kubernetes-int-or-string")]
    assert (
        len(quantities) == 5
    )  # weightsBytes, kvCacheBytes, minHbmBytes, hostBytes, maxPromptBytes
    for node in quantities:
        assert node["minimum"] == 1
        for bad in ("0", "-1", "500m", "0Gi", "1.5", "0.5Ki"):
            assert not re.match(node["pattern"], bad), bad
    durations = [
        n for p, n in walk(spec) if p.endswith(("idleAfter", "minResident", "queueTimeout"))
    ]
    assert len(durations) == 3
    for node in durations:
        assert re.match(node["pattern"], "never") and re.match(node["pattern"], "1h30m")


def test_model_deployment_names_and_printer_columns() -> None:
    crd = ALL[crds.MODEL_DEPLOYMENT]
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["shortNames"] == ["md"]
    version = crds.version_of(crd, crds.VERSION)
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Model", "Node", "Phase", "Ready", "Reason", "Resident", "Host", "KV",
                       "Swap-Ins", "GPU", "Last-Request", "Age"]  # fmt: skip
    swap_node = ALL[crds.SWAP_NODE]
    assert swap_node["spec"]["scope"] == "Cluster"
    assert crds.version_of(swap_node, crds.VERSION)["subresources"] == {"status": {}}
