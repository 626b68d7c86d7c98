"""config.pbtxt parsing and the merge with modelswap's parameters; UID-derived names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from modelswap_sidecar.triton.config import (
    AGENT_SOCKET_KEY,
    GPU_ORDINAL_KEY,
    KV_CACHE_BYTES_KEY,
    MAPPER_KEY,
    UID_KEY,
    WEIGHTS_BYTES_KEY,
    ModelswapParameters,
    config_json,
    merge_config,
    parameters_of,
    parse_model_config,
    read_model_config,
)
from modelswap_sidecar.triton.errors import ModelConfigInvalid
from modelswap_sidecar.triton.naming import is_triton_model_name, triton_model_name, uid_of

UID = "0b6f3c1e-5a4d-4e0f-9c2b-7d8e9f0a1b2c"
NAME = "m-0b6f3c1e5a4d4e0f9c2b7d8e9f0a1b2c"

PBTXT = """
name: "llama"
backend: "python"
max_batch_size: 8
input [ { name: "TOKENS" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "LOGITS" data_type: TYPE_FP32 dims: [ -1, 32000 ] } ]
instance_group [
  { kind: KIND_GPU count: 2 gpus: [ 3 ] },
  { kind: KIND_CPU count: 1 }
]
parameters { key: "temperature" value: { string_value: "0.7" } }
parameters { key: "modelswap.uid" value: { string_value: "forged" } }
"""


def params(**overrides: object) -> ModelswapParameters:
    values: dict[str, object] = {
        "uid": UID,
        "gpu_ordinal": 1,
        "weights_bytes": 4 << 30,
        "kv_cache_bytes": 1 << 30,
        "agent_socket": "/run/modelswap/agent.sock",
        **overrides,
    }
    return ModelswapParameters(**values)  # type: ignore[arg-type]


def merged_document() -> dict[str, object]:
    config = parse_model_config(PBTXT, origin="test")
    document: dict[str, object] = json.loads(
        config_json(merge_config(config, triton_name=NAME, parameters=params()))
    )
    return document


def test_merge_renames_the_model_after_its_uid() -> None:
    assert merged_document()["name"] == NAME


def test_merge_adds_modelswap_parameters_and_keeps_the_models_own() -> None:
    parameters = parameters_of(merged_document())  # type: ignore[arg-type]
    assert parameters == {
        "temperature": "0.7",
        UID_KEY: UID,  # the pbtxt's forged value is replaced
        GPU_ORDINAL_KEY: "1",
        WEIGHTS_BYTES_KEY: str(4 << 30),
        KV_CACHE_BYTES_KEY: str(1 << 30),
        AGENT_SOCKET_KEY: "/run/modelswap/agent.sock",
        MAPPER_KEY: "sim",
    }


def test_merge_pins_gpu_instance_groups_to_the_placed_gpu_and_leaves_cpu_groups() -> None:
    groups = merged_document()["instance_group"]
    assert groups == [
        {"kind": "KIND_GPU", "count": 2, "gpus": [1]},
        {"kind": "KIND_CPU", "count": 1},
    ]


def test_merge_keeps_everything_else_and_does_not_change_its_input() -> None:
    config = parse_model_config(PBTXT, origin="test")
    before = config.SerializeToString()
    document = json.loads(config_json(merge_config(config, triton_name=NAME, parameters=params())))
    assert config.SerializeToString() == before
    assert document["backend"] == "python"
    assert document["max_batch_size"] == 8
    assert document["output"][0]["dims"] == [
        "-1",
        "32000",
    ]  # int64 as JSON strings: Triton takes them


def test_extra_parameters_take_the_prefix_and_cannot_replace_the_agents() -> None:
    extra = params(extra={"kv.offload_after_tokens": "4096"}).as_parameters()
    assert extra["modelswap.kv.offload_after_tokens"] == "4096"
    with pytest.raises(ValueError, match=r"would replace modelswap\.uid"):
        params(extra={"uid": "other"}).as_parameters()


def test_a_bad_pbtxt_is_reported_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: "many"\n')
    with pytest.raises(ModelConfigInvalid, match=re.escape(str(tmp_path / "config.pbtxt"))):
        read_model_config(tmp_path)


def test_a_missing_pbtxt_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigInvalid, match=r"no config\.pbtxt"):
        read_model_config(tmp_path)


def test_names_are_derived_from_uids_and_back() -> None:
    assert triton_model_name(UID) == NAME
    assert triton_model_name(UID.upper()) == NAME
    assert uid_of(NAME) == UID
    assert is_triton_model_name(NAME)
    assert not is_triton_model_name("llama")
    with pytest.raises(ValueError, match="not a UID"):
        triton_model_name("llama")


def test_two_namespaces_llama_get_different_triton_names() -> None:
    first = triton_model_name("11111111-1111-4111-8111-111111111111")
    second = triton_model_name("22222222-2222-4222-8222-222222222222")
    assert first != second
