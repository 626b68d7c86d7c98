"""A model's config.pbtxt merged with what modelswap hands the model at load.

A `config` sent with a repository load *replaces* the model's config.pbtxt (DESIGN.md §8),
so the driver parses the pbtxt (`model_config_pb2` from tritonclient, protobuf
`text_format`), merges, and sends the whole merged config as JSON. The merge:

- sets `name` to the Triton model name (a pbtxt written for `llama` would otherwise be
  refused under the name `m-<uid>`);
- adds string parameters under the reserved `modelswap.` prefix (see `PARAMETER_KEYS`);
  values the pbtxt already had under that prefix are replaced;
- pins every `KIND_GPU` instance group to the GPU the agent placed the model on (CPU
  groups are left alone).

Parameters are readable back by anyone through Triton's config API: nothing secret goes
there (no tokens, no source credentials), only where to find the agent and what to ask it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from modelswap_sidecar.triton.errors import ModelConfigInvalid

log = logging.getLogger(__name__)

CONFIG_FILE_NAME = "config.pbtxt"
PARAMETER_PREFIX = "modelswap."
#: What a python-backend model finds in `json.loads(args["model_config"])["parameters"]`,
#: each as `{"string_value": ...}`.
UID_KEY = "modelswap.uid"
GPU_ORDINAL_KEY = "modelswap.gpu_ordinal"
WEIGHTS_BYTES_KEY = "modelswap.weights_bytes"
KV_CACHE_BYTES_KEY = "modelswap.kv_cache_bytes"
AGENT_SOCKET_KEY = "modelswap.agent_socket"
MAPPER_KEY = "modelswap.mapper"
#: The GPU's UUID (device mappers only: the model process resolves it to its own ordinal,
#: `CudaVmmMapper(device=…)`); absent for sim.
GPU_UUID_KEY = "modelswap.gpu_uuid"
PARAMETER_KEYS = (
    UID_KEY,
    GPU_ORDINAL_KEY,
    WEIGHTS_BYTES_KEY,
    KV_CACHE_BYTES_KEY,
    AGENT_SOCKET_KEY,
    MAPPER_KEY,
    GPU_UUID_KEY,
)

ModelConfig = model_config_pb2.ModelConfig


@dataclass(frozen=True)
class ModelswapParameters:
    """What a model needs to find its agent and its memory (nothing secret)."""

    uid: str
    gpu_ordinal: int
    weights_bytes: int
    kv_cache_bytes: int
    agent_socket: str
    mapper: str = "sim"
    #: The GPU by UUID, for device mappers (their processes may number GPUs differently).
    gpu_uuid: str | None = None
    #: More `modelswap.<key>` parameters (keys without the prefix), e.g. KV tier settings.
    extra: Mapping[str, str] = field(default_factory=dict, hash=False)

    def as_parameters(self) -> dict[str, str]:
        values = {
            UID_KEY: self.uid,
            GPU_ORDINAL_KEY: str(self.gpu_ordinal),
            WEIGHTS_BYTES_KEY: str(self.weights_bytes),
            KV_CACHE_BYTES_KEY: str(self.kv_cache_bytes),
            AGENT_SOCKET_KEY: self.agent_socket,
            MAPPER_KEY: self.mapper,
        }
        if self.gpu_uuid is not None:
            values[GPU_UUID_KEY] = self.gpu_uuid
        for key, value in self.extra.items():
            full = PARAMETER_PREFIX + key
            if full in values:
                raise ValueError(f"extra parameter {key!r} would replace {full}")
            values[full] = value
        return values


def parse_model_config(text: str, *, origin: str) -> Any:
    """Parse config.pbtxt text into a `ModelConfig`; `origin` names it in errors."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ModelConfigInvalid(f"{origin}: {e}") from e
    return config


def read_model_config(model_dir: Path) -> Any:
    """The `ModelConfig` of a model directory (its config.pbtxt must exist)."""
    path = model_dir / CONFIG_FILE_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ModelConfigInvalid(f"{path}: no {CONFIG_FILE_NAME} in the model directory") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ModelConfigInvalid(f"{path}: {e}") from e
    return parse_model_config(text, origin=str(path))


def merge_config(config: Any, *, triton_name: str, parameters: ModelswapParameters) -> Any:
    """A merged copy of `config` (the argument is not changed)."""
    merged = ModelConfig()
    merged.CopyFrom(config)
    if merged.name and merged.name != triton_name:
        log.debug("model config name %r replaced by %r", merged.name, triton_name)
    merged.name = triton_name
    for key, value in parameters.as_parameters().items():
        if key in merged.parameters and merged.parameters[key].string_value != value:
            log.warning("%s: config.pbtxt parameter %s replaced by the agent's", triton_name, key)
        merged.parameters[key].string_value = value
    for group in merged.instance_group:
        if group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU:
            del group.gpus[:]
            group.gpus.append(parameters.gpu_ordinal)
    return merged


def config_json(config: Any) -> str:
    """The JSON form Triton's repository load accepts as `config`."""
    document: dict[str, Any] = json_format.MessageToDict(config, preserving_proto_field_name=True)
    return json.dumps(document, sort_keys=True)


def parameters_of(config_document: Mapping[str, Any]) -> dict[str, str]:
    """The string parameters of a config as Triton's config API returns it (JSON)."""
    raw = config_document.get("parameters") or {}
    return {str(key): str(value.get("string_value", "")) for key, value in raw.items()}
