"""Attaching from inside a Triton python-backend model: one call with `initialize`'s args.

    from modelswap_client.triton import attach_model

    def initialize(self, args):
        self.att = attach_model(args)

The agent adds `modelswap.*` parameters to every model config it loads (agent socket,
`weightsBytes`, `kvCacheBytes`, the mapper, the GPU's UUID): `attach_model` reads them and
attaches with a `weights` region of `weightsBytes` and, when `kvCacheBytes` is set, a
`kv` region of that size. Standard library only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from modelswap_api.wire import ErrorCode, RegionKind
from modelswap_client.client import Attachment, attach
from modelswap_client.errors import ClientError
from modelswap_client.regions import RegionSpec

__all__ = ["attach_model", "model_parameter"]

WEIGHTS_TAG = "weights"
KV_TAG = "kv"


def model_parameter(config: Mapping[str, Any], key: str, default: str | None = None) -> str:
    """A `parameters` entry of a Triton model config (as `initialize` gets it, parsed)."""
    entry = config.get("parameters", {}).get(key)
    if entry is None:
        if default is None:
            raise ClientError(
                f"model parameter {key} is missing: is this model loaded by a modelswap agent?",
                ErrorCode.BAD_REQUEST,
            )
        return default
    return str(entry["string_value"])


def log_to_stderr() -> None:
    """Triton's stub configures no Python logging, so the library's INFO lines (which
    host copy was bound, what was loaded) would be lost: send the `modelswap_client`
    loggers to stderr, which Triton writes to its log — unless the model set up logging."""
    library = logging.getLogger("modelswap_client")
    if library.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
    library.addHandler(handler)
    library.setLevel(logging.INFO)


def attach_model(args: Mapping[str, str], **options: Any) -> Attachment:
    """Attach the model Triton is initialising (`args` of `initialize`): a `weights`
    region of its `weightsBytes`, and a `kv` region of its `kvCacheBytes` when set.
    `options` go to `attach` (e.g. `timeout_seconds`)."""
    log_to_stderr()
    config = json.loads(args["model_config"])
    weights_bytes = int(model_parameter(config, "modelswap.weights_bytes"))
    kv_bytes = int(model_parameter(config, "modelswap.kv_cache_bytes", "0"))
    regions = [RegionSpec(WEIGHTS_TAG, weights_bytes)]
    if kv_bytes > 0:
        regions.append(RegionSpec(KV_TAG, kv_bytes, RegionKind.KV))
    uuid = model_parameter(config, "modelswap.gpu_uuid", "")
    return attach(
        args["model_name"],
        regions,
        instance=args.get("model_instance_name", "0"),
        socket_path=model_parameter(config, "modelswap.agent_socket"),
        mapper=model_parameter(config, "modelswap.mapper", "sim"),
        device=uuid or None,
        **options,
    )
