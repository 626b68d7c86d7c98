"""Hostile YAML and oversized specs are refused before the expensive work, naming the limit
or the field (issue 12, finding 2): `modelswap validate`, local mode's folder reader and the
control API's desired set. Times are not asserted; the timeout marker only keeps a
regression from stalling the suite for minutes."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from modelswap_api import yaml_input
from modelswap_api.control import parse_desired_set
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.errors import ResourceError
from modelswap_api.resources import MAX_ANNOTATIONS_BYTES
from modelswap_api.validate_command import validate_paths
from modelswap_api.yaml_input import YamlInputError, load_text
from modelswap_sidecar.control.app import make_app
from modelswap_sidecar.control.auth import TokenFile
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings
from modelswap_sidecar.local.manifests import read_folder
from tests.support.memory_backend import InMemoryBackend

pytestmark = pytest.mark.timeout(30)

UID = "2f1c8a52-7d0e-4c1b-9a57-0d1b5c3e9a10"
SPEC: dict[str, Any] = {
    "model": {"runtime": "triton", "source": {"uri": "/models/mlp"}, "weightsBytes": "32Mi"}
}


def manifest(name: str = "classify", **extra: Any) -> dict[str, Any]:
    metadata = {"name": name, "namespace": "default", **extra.pop("metadata", {})}
    spec = {**SPEC, **extra.pop("spec", {})}
    return {"apiVersion": "modelswap.io/v1alpha1", "kind": "ModelDeployment",
            "metadata": metadata, "spec": spec}  # fmt: skip


def laughs(levels: int, width: int) -> str:
    """Nested anchors: `levels` lines of `width` aliases each, expanding to width**levels."""
    lines = ["l0: &l0 [" + ",".join(["lol"] * width) + "]"]
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [" + ",".join([f"*l{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def validate(*paths: Path) -> tuple[int, str]:
    out = io.StringIO()
    return validate_paths(list(paths), out), out.getvalue()


# -- the YAML reader ---------------------------------------------------------------------------


def test_billion_laughs_is_refused_by_the_alias_count() -> None:
    text = laughs(9, 9)  # the file: 81 aliases, 9**9 nodes expanded
    with pytest.raises(YamlInputError, match=r"more than 64 aliases .*MAX_YAML_ALIASES"):
        load_text(text)


def test_fewer_aliases_that_still_expand_are_refused_by_the_expansion() -> None:
    text = laughs(5, 12)  # 60 aliases, 12**5 = 248,832 leaves
    with pytest.raises(YamlInputError, match="MAX_YAML_ALIAS_EXPANSION_NODES"):
        load_text(text)


def test_a_few_aliases_as_people_write_them_are_taken() -> None:
    text = (
        "base: &tolerations [{key: a, operator: Exists}]\n"
        "one: {tolerations: *tolerations}\n"
        "defaults: &d {idleAfter: 5m}\n"
        "policy: {<<: *d, idleAfter: 10m}\n"  # a merge key overriding is no duplicate
    )
    [doc] = load_text(text)
    assert doc["one"]["tolerations"] == [{"key": "a", "operator": "Exists"}]
    assert doc["policy"] == {"idleAfter": "10m"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: 1\nb:\n  c: 2\n  c: 3\n", "line 4: duplicate key 'c'"),
        ("metadata: {name: x}\nmetadata: {name: y}\n", "line 2: duplicate key 'metadata'"),
        ("a: &x [*x]\n", "an alias refers to itself"),
        ("[" * 200_000, "nested deeper than 64 levels (MAX_YAML_DEPTH)"),
        ("{a: " * 200_000, "nested deeper than 64 levels (MAX_YAML_DEPTH)"),
        ("a: [unclosed\n", "cannot read YAML"),
    ],
)
def test_malformed_yaml_is_refused_naming_the_problem(text: str, expected: str) -> None:
    with pytest.raises(YamlInputError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_text(text)


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    body = "".join(f"    k{i}: v\n" for i in range(400_000))  # ~5 MB
    big.write_text(yaml.safe_dump(manifest()) + "  placement:\n   nodeSelector:\n" + body)
    with pytest.raises(YamlInputError, match=r"larger than the 1048576-byte limit"):
        yaml_input.load_file(big)


# -- modelswap validate ------------------------------------------------------------------------


def test_validate_names_the_limit_per_file_and_checks_the_others(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(manifest()))
    (tmp_path / "laughs.yaml").write_text(laughs(9, 9))
    (tmp_path / "dup.yaml").write_text(yaml.safe_dump(manifest()) + "kind: ModelDeployment\n")
    (tmp_path / "huge.yaml").write_text("a: " + "x" * (2 << 20) + "\n")
    status, out = validate(tmp_path)
    assert status == 1
    assert f"{tmp_path / 'laughs.yaml'}: file: line 9 (l8[1]): more than 64 aliases" in out
    assert f"{tmp_path / 'dup.yaml'}: file: line " in out and "duplicate key 'kind'" in out
    assert f"{tmp_path / 'huge.yaml'}: file: 2097156 bytes: larger than the 1048576" in out
    assert "3 problem(s)" in out


def test_an_oversized_map_is_refused_naming_the_field_before_the_schema_runs(
    tmp_path: Path,
) -> None:
    def write(entries: int) -> Path:
        selector = {f"label-{i}": "x" for i in range(entries)}  # the schema allows 64
        file = tmp_path / f"selector-{entries}.yaml"
        file.write_text(yaml.safe_dump(manifest(spec={"placement": {"nodeSelector": selector}})))
        return file

    status, out = validate(write(5_000))
    assert status == 1
    assert "spec.placement.nodeSelector: Too many: 5000: must have at most 64 properties" in out
    assert out.count("\n") == 2  # that one problem, and the summary
    status, out = validate(write(20_000))  # past the node limit: refused while reading
    assert status == 1
    assert "(spec.placement.nodeSelector.label-" in out
    assert "more than 20000 nodes in one file (MAX_YAML_NODES)" in out


def test_annotations_over_256_kib_in_all_are_refused(tmp_path: Path) -> None:
    half = "x" * (MAX_ANNOTATIONS_BYTES // 2)
    file = tmp_path / "annotated.yaml"
    file.write_text(
        yaml.safe_dump(manifest(metadata={"annotations": {"a": half, "b": half}}), width=1 << 30)
    )
    status, out = validate(file)
    assert status == 1
    assert "metadata.annotations: Too long: must have at most 262144 bytes" in out
    file.write_text(yaml.safe_dump(manifest(metadata={"annotations": {"a": half}})))
    assert validate(file)[0] == 0


# -- local mode --------------------------------------------------------------------------------


def test_local_mode_serves_the_good_files_beside_hostile_ones(tmp_path: Path) -> None:
    (tmp_path / "a-good.yaml").write_text(yaml.safe_dump(manifest("classify")))
    (tmp_path / "b-laughs.yaml").write_text(laughs(9, 9))
    (tmp_path / "c-dup.yaml").write_text("apiVersion: v1\napiVersion: v2\n")
    selector = {f"k{i}": "v" for i in range(1000)}
    (tmp_path / "d-selector.yaml").write_text(
        yaml.safe_dump(manifest("chat", spec={"placement": {"nodeSelector": selector}}))
    )
    (tmp_path / "e-latin1.yaml").write_bytes(b"metadata: {name: caf\xe9}\n")
    models, problems = read_folder(tmp_path, BUILTIN_DEFAULTS)
    assert [m.name for m in models] == ["classify"]
    shown = [str(p) for p in problems]
    assert any("b-laughs.yaml: file: line 9 (l8[1]): more than 64 aliases" in p for p in shown)
    assert any("c-dup.yaml: file: line 2: duplicate key 'apiVersion'" in p for p in shown)
    assert any("spec.placement.nodeSelector: Too many: 1000" in p for p in shown)
    assert any("e-latin1.yaml: file: not UTF-8 text (byte 20" in p for p in shown)


# -- the control API's desired set -------------------------------------------------------------


def desired(spec: dict[str, Any]) -> dict[str, Any]:
    entry = {"uid": UID, "namespace": "ns", "name": "m", "generation": 1, "spec": spec}
    return {"revision": {"term": 1, "counter": 1}, "entries": [entry]}


def test_a_desired_entry_with_400000_selector_entries_is_refused_naming_the_field() -> None:
    selector = {f"k{i}": "v" for i in range(400_000)}
    with pytest.raises(ResourceError) as refused:
        parse_desired_set(desired({**SPEC, "placement": {"nodeSelector": selector}}))
    [error] = refused.value.errors
    assert error.path == "entries[0].spec.placement.nodeSelector"
    assert "at most 64 properties" in error.message


@pytest.mark.asyncio
async def test_the_control_api_refuses_a_body_over_its_size_limit(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    settings = ControlSettings(
        node_name="n", token_file=tmp_path / "token", state_file=tmp_path / "rev.json"
    )
    service = ControlService(InMemoryBackend("n", {"g": 1 << 30}), settings, clock=lambda: 0.0)
    app = make_app(service, TokenFile(tmp_path / "token"))
    body = json.dumps(desired({**SPEC, "padding": "x" * settings.max_body_bytes}))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        response = await client.put("/v1/desired", data=body, headers={"Authorization": "Bearer t"})
        assert response.status == 413
        assert str(settings.max_body_bytes) in (await response.json())["message"]
