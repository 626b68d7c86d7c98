"""`effective_policy(spec, defaults)`: a ModelDeployment's policy fields over cluster defaults.

The CRD's cross-field rules hold for the spec alone; merging can still break them (a spec
`minResident: 10m` over a default `idleAfter: 5m`). The merged sections are re-checked with
the same CEL rules, and a failure names both fields and where each value came from.

`EffectivePolicy.from_status(status)` reads a merged policy back from its wire form
(`status.effectivePolicy`, a desired entry's `policy`), checked as complete cluster
defaults are: every field set, each within the CRD's bounds and cross-field rules.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelswap_api.cel import Rule, compile_rule
from modelswap_api.defaults import (
    DEFAULT_MAX_PROMPT_BYTES,
    DEFAULT_MAX_TOKENS,
    POLICY_SECTIONS,
    check_defaults,
    spec_schema,
)
from modelswap_api.errors import PolicyError
from modelswap_api.field_errors import FieldError, show_value
from modelswap_api.models import BatchShapingPolicy, EffectivePolicyStatus, KvMode, OnSwapOut
from modelswap_api.quantities import Duration, Quantity
from modelswap_api.validation import SchemaValidator

#: Each `EffectivePolicyStatus` wire field → the spec section and field it is merged from.
STATUS_FIELDS: Mapping[str, tuple[str, str]] = {
    "idleAfter": ("swapPolicy", "idleAfter"),
    "minResident": ("swapPolicy", "minResident"),
    "priority": ("swapPolicy", "priority"),
    "pinned": ("swapPolicy", "pinned"),
    "onSwapOut": ("swapPolicy", "onSwapOut"),
    "kv": ("swapPolicy", "kv"),
    "offloadAfterTokens": ("kvCache", "offloadAfterTokens"),
    "kvHostBytes": ("kvCache", "hostBytes"),
    "maxQueued": ("gateway", "maxQueued"),
    "queueTimeout": ("gateway", "queueTimeout"),
    "maxTokens": ("gateway", "maxTokens"),
    "maxPromptBytes": ("gateway", "maxPromptBytes"),
    "batchShaping": ("gateway", "batchShaping"),
}
_STATUS_FIELD_OF = {merged: name for name, merged in STATUS_FIELDS.items()}
#: `gateway.batchShaping` off (the built-in default).
SHAPING_OFF = BatchShapingPolicy(max_wait_milliseconds=0)


@dataclass(frozen=True)
class EffectivePolicy:
    """The policy in force for one model, every field set."""

    idle_after: Duration
    min_resident: Duration
    priority: int
    pinned: bool
    on_swap_out: OnSwapOut
    kv: KvMode
    offload_after_tokens: int
    kv_host_bytes: int
    max_queued: int
    queue_timeout: Duration
    #: most tokens one generate request may ask for (and get, when it asks for none)
    max_tokens: int = DEFAULT_MAX_TOKENS
    #: longest prompt of one generate request, UTF-8 bytes
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    #: prompt-length buckets the gateway groups requests by (off: a wait of 0)
    batch_shaping: BatchShapingPolicy = SHAPING_OFF

    @classmethod
    def from_status(cls, status: EffectivePolicyStatus) -> EffectivePolicy:
        """The policy `status` describes (`to_status`'s inverse). PolicyError whose
        FieldErrors name the status field (`idleAfter`, `kvHostBytes`, …) when one is
        missing, out of bounds (a malformed duration, a negative number) or breaks a
        cross-field rule (`minResident` longer than `idleAfter`)."""
        sections: dict[str, dict[str, Any]] = {section: {} for section in POLICY_SECTIONS}
        for name, value in status.to_dict().items():
            section, key = STATUS_FIELDS[name]
            sections[section][key] = value
        try:
            checked = check_defaults(sections)
        except PolicyError as e:
            errors = [
                FieldError(_status_path(error.path), error.reason, error.message)
                for error in e.errors
            ]
            raise PolicyError(errors, "invalid effective policy") from e
        return _policy_of(checked)

    def to_status(self) -> EffectivePolicyStatus:
        return EffectivePolicyStatus(
            idle_after=self.idle_after.raw,
            min_resident=self.min_resident.raw,
            priority=self.priority,
            pinned=self.pinned,
            on_swap_out=self.on_swap_out,
            kv=self.kv,
            offload_after_tokens=self.offload_after_tokens,
            kv_host_bytes=self.kv_host_bytes,
            max_queued=self.max_queued,
            queue_timeout=self.queue_timeout.raw,
            max_tokens=self.max_tokens,
            max_prompt_bytes=self.max_prompt_bytes,
            batch_shaping=self.batch_shaping,
        )


def effective_policy(spec: Mapping[str, Any], defaults: Mapping[str, Any]) -> EffectivePolicy:
    """Merge `spec`'s policy sections (wire form) over complete `defaults`.

    PolicyError when the defaults are malformed or a cross-field rule breaks only after the
    merge; its FieldErrors name the spec field and mention both fields and their origins.
    """
    checked = check_defaults(defaults)
    merged: dict[str, dict[str, Any]] = {}
    origin: dict[tuple[str, str], str] = {}
    for section in POLICY_SECTIONS:
        given = spec.get(section) or {}
        merged[section] = {**checked[section], **given}
        for key in merged[section]:
            origin[(section, key)] = (
                f"spec.{section}.{key}" if key in given else f"cluster defaults {section}.{key}"
            )
    errors = list(_merged_rule_errors(merged, origin))
    if errors:
        raise PolicyError(errors, "effective policy is invalid")
    return _policy_of(merged)


def _policy_of(merged: Mapping[str, Mapping[str, Any]]) -> EffectivePolicy:
    """The policy from complete, checked policy sections (wire form)."""
    swap, kv_cache, gateway = merged["swapPolicy"], merged["kvCache"], merged["gateway"]
    return EffectivePolicy(
        idle_after=Duration(swap["idleAfter"]),
        min_resident=Duration(swap["minResident"]),
        priority=int(swap["priority"]),
        pinned=bool(swap["pinned"]),
        on_swap_out=swap["onSwapOut"],
        kv=swap["kv"],
        offload_after_tokens=int(kv_cache["offloadAfterTokens"]),
        kv_host_bytes=Quantity(kv_cache["hostBytes"]).bytes,
        max_queued=int(gateway["maxQueued"]),
        queue_timeout=Duration(gateway["queueTimeout"]),
        max_tokens=int(gateway["maxTokens"]),
        max_prompt_bytes=Quantity(gateway["maxPromptBytes"]).bytes,
        batch_shaping=BatchShapingPolicy.from_dict(gateway["batchShaping"]),
    )


def _status_path(defaults_path: str) -> str:
    """`defaults.swapPolicy.idleAfter` (a `check_defaults` path) → `idleAfter`; a path
    naming no single field → the policy itself ("")."""
    parts = defaults_path.split(".")
    if len(parts) >= 3 and (parts[1], parts[2]) in _STATUS_FIELD_OF:
        return _STATUS_FIELD_OF[(parts[1], parts[2])]
    return ""


def _merged_rule_errors(
    merged: Mapping[str, Mapping[str, Any]], origin: Mapping[tuple[str, str], str]
) -> list[FieldError]:
    errors: list[FieldError] = []
    for section in POLICY_SECTIONS:
        validator, rules = _section_checks(section)
        for error in validator.validate(merged[section]).errors:
            reported = error.path.split(".")[0].split("[")[0]
            involved = _fields_of_failed_rule(rules, error, reported)
            sources = ", ".join(
                f"{name}={show_value(merged[section][name])} from {origin[(section, name)]}"
                for name in involved
                if name in merged[section]
            )
            errors.append(
                FieldError(
                    f"spec.{section}.{error.path}" if error.path else f"spec.{section}",
                    error.reason,
                    f"{error.message} (after merging over cluster defaults: {sources})",
                )
            )
    return errors


@functools.cache
def _section_checks(section: str) -> tuple[SchemaValidator, tuple[Rule, ...]]:
    schema = spec_schema()["properties"][section]
    rules = tuple(
        compile_rule(entry, f"spec.{section}")
        for entry in schema.get("x-kubernetes-validations", ())
    )
    return SchemaValidator(schema), rules


def _fields_of_failed_rule(rules: tuple[Rule, ...], error: FieldError, reported: str) -> list[str]:
    """The fields the failed rule reads, the reported field first."""
    for rule in rules:
        if rule.message in error.message:
            return sorted(rule.fields_read, key=lambda name: name != reported)
    return [reported]
