"""Cluster defaults for policy fields: their schema and the built-in values.

The chart's values (operator settings) and local mode's defaults file supply a complete
set in this shape; `effective_policy` merges a ModelDeployment's fields over it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

from modelswap_api import crds
from modelswap_api.errors import PolicyError
from modelswap_api.field_errors import FieldError
from modelswap_api.validation import SchemaValidator

POLICY_SECTIONS = ("swapPolicy", "kvCache", "gateway")

#: `gateway.maxTokens`: tokens one generate request may ask for. 4,096 is more than the
#: example models' context windows (tinyllama: 2,048) and far below an unbounded loop.
DEFAULT_MAX_TOKENS = 4096
#: `gateway.maxPromptBytes`: a prompt's UTF-8 bytes. 1 MiB is ~250,000 tokens of English,
#: past every context window the examples have, while a 7 MB prompt is refused.
DEFAULT_MAX_PROMPT_BYTES = 1 << 20

BUILTIN_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "swapPolicy": {
        "idleAfter": "10m",
        "minResident": "1m",
        "priority": 100,
        "pinned": False,
        "onSwapOut": "host",
        "kv": "discard",
    },
    "kvCache": {"offloadAfterTokens": 4096, "hostBytes": "1Gi"},
    "gateway": {
        "maxQueued": 100,
        "queueTimeout": "60s",
        "maxTokens": DEFAULT_MAX_TOKENS,
        "maxPromptBytes": "1Mi",  # DEFAULT_MAX_PROMPT_BYTES
        # off: requests go to the model as they come (docs/GATEWAY.md, batch shaping)
        "batchShaping": {"maxWaitMilliseconds": 0, "promptBytesEdges": []},
    },
}

#: Policy fields added after defaults files, chart values and saved desired entries were
#: first written without them: a complete set may lack them, and takes the built-in value
#: (an older chart's `policyDefaults`, an older agent's `desired.json`, an older operator's
#: entries all stay valid).
ADDED_FIELDS: tuple[tuple[str, str], ...] = (
    ("gateway", "maxTokens"),
    ("gateway", "maxPromptBytes"),
    ("gateway", "batchShaping"),
)


@functools.cache
def spec_schema() -> Mapping[str, Any]:
    """The ModelDeployment `spec` schema of the served version."""
    version = crds.version_of(crds.crd_for(crds.MODEL_DEPLOYMENT), crds.VERSION)
    spec: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


@functools.cache
def defaults_schema() -> dict[str, Any]:
    """The policy sections of the ModelDeployment spec schema, with every field required."""
    sections: dict[str, Any] = {}
    for name in POLICY_SECTIONS:
        section = copy.deepcopy(spec_schema()["properties"][name])
        section["required"] = sorted(section["properties"])
        sections[name] = section
    return {
        "type": "object",
        "description": "Cluster defaults for ModelDeployment policy fields.",
        "required": list(POLICY_SECTIONS),
        "properties": sections,
    }


@functools.cache
def _defaults_validator() -> SchemaValidator:
    return SchemaValidator(defaults_schema(), kind="PolicyDefaults")


def check_defaults(defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Validated defaults (`ADDED_FIELDS` a set lacks filled in from `BUILTIN_DEFAULTS`);
    PolicyError naming `defaults.<section>.<field>` otherwise."""
    result = _defaults_validator().validate(with_added_fields(defaults))
    errors = [
        FieldError(f"defaults.{e.path}" if e.path else "defaults", e.reason, e.message)
        for e in result.errors
    ]
    errors += [
        FieldError(f"defaults.{path}", "FieldValueUnknown", f'unknown field "{path}"')
        for path in result.unknown_fields
    ]
    if errors:
        raise PolicyError(errors, "invalid policy defaults")
    return result.object


def with_added_fields(defaults: Mapping[str, Any]) -> Mapping[str, Any]:
    """`defaults` with each of `ADDED_FIELDS` it lacks (in a section it has) set to the
    built-in value; anything else is left for the validator to judge."""
    filled: dict[str, Any] | None = None
    for section, key in ADDED_FIELDS:
        given = defaults.get(section)
        if isinstance(given, Mapping) and key not in given:
            if filled is None:
                filled = dict(defaults)
            filled[section] = {**filled[section], key: BUILTIN_DEFAULTS[section][key]}
    return defaults if filled is None else filled
