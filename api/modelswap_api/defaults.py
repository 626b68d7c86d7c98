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
    "gateway": {"maxQueued": 100, "queueTimeout": "60s"},
}


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
    """Validated defaults; PolicyError naming `defaults.<section>.<field>` otherwise."""
    result = _defaults_validator().validate(defaults)
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
