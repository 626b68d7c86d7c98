"""The models a scenario serves: sizes, per-token times and their policy fields.

A scenario lists groups (`count` models of one size); each becomes `<name>-<i>` models.
Policy fields are ModelDeployment spec sections in wire form (`swapPolicy`, `kvCache`,
`gateway`) and are merged over cluster defaults with the same `effective_policy` the
operator and local mode use, so a field the CRD refuses is refused here too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modelswap_api.defaults import BUILTIN_DEFAULTS, POLICY_SECTIONS
from modelswap_api.errors import PolicyError, QuantityError
from modelswap_api.policy import EffectivePolicy, effective_policy
from modelswap_api.quantities import parse_bytes
from modelswap_sidecar.simulate.errors import ScenarioError


@dataclass(frozen=True, kw_only=True)
class CatalogueModel:
    name: str
    weights_bytes: int
    kv_cache_bytes: int = 0
    #: decode time per output token of one request (the request's own; see gpu.py)
    per_output_token_seconds: float
    #: prefill time per input token (0: prefill is not modelled)
    per_input_token_seconds: float = 0.0
    #: the model's own policy sections (wire form), merged over each policy's defaults
    spec: Mapping[str, Any] = field(default_factory=dict)

    @property
    def hbm_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes

    def service_seconds(self, input_tokens: int, output_tokens: int) -> float:
        return (
            output_tokens * self.per_output_token_seconds
            + input_tokens * self.per_input_token_seconds
        )


def models_of(groups: Any, where: str = "models") -> tuple[CatalogueModel, ...]:
    """The catalogue from a scenario's `models:` list of groups."""
    if not isinstance(groups, list) or not groups:
        raise ScenarioError(f"{where} must be a non-empty list of model groups")
    out: list[CatalogueModel] = []
    for g, group in enumerate(groups):
        at = f"{where}[{g}]"
        if not isinstance(group, dict):
            raise ScenarioError(f"{at} must be a mapping")
        known = {"name", "count", "weightsBytes", "kvCacheBytes", "perTokenSeconds",
                 "perInputTokenSeconds", *POLICY_SECTIONS}  # fmt: skip
        unknown = sorted(set(group) - known)
        if unknown:
            raise ScenarioError(f"{at}: unknown field {unknown[0]!r}")
        name = group.get("name")
        if not isinstance(name, str) or not name:
            raise ScenarioError(f"{at}.name must be a non-empty string")
        count = group.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ScenarioError(f"{at}.count must be a whole number of at least 1")
        weights = _bytes(group.get("weightsBytes"), f"{at}.weightsBytes")
        kv_raw = group.get("kvCacheBytes", 0)
        kv = 0 if kv_raw == 0 else _bytes(kv_raw, f"{at}.kvCacheBytes")
        per_token = _seconds(group.get("perTokenSeconds"), f"{at}.perTokenSeconds", positive=True)
        per_input = _seconds(group.get("perInputTokenSeconds", 0.0), f"{at}.perInputTokenSeconds")
        spec = {s: group[s] for s in POLICY_SECTIONS if s in group}
        for i in range(count):
            out.append(
                CatalogueModel(
                    name=name if count == 1 else f"{name}-{i:02d}",
                    weights_bytes=weights,
                    kv_cache_bytes=kv,
                    per_output_token_seconds=per_token,
                    per_input_token_seconds=per_input,
                    spec=spec,
                )
            )
    names = [m.name for m in out]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise ScenarioError(f"{where}: model name {duplicate!r} appears twice")
    return tuple(out)


def resolve_policies(
    models: tuple[CatalogueModel, ...], overrides: Mapping[str, Any]
) -> tuple[EffectivePolicy, ...]:
    """Each model's effective policy: its spec over `overrides` over the built-in defaults."""
    defaults = {
        section: {**BUILTIN_DEFAULTS[section], **(overrides.get(section) or {})}
        for section in POLICY_SECTIONS
    }
    out = []
    for model in models:
        try:
            out.append(effective_policy(model.spec, defaults))
        except PolicyError as e:
            raise ScenarioError(f"model {model.name}: {e}") from e
    return tuple(out)


def _bytes(value: Any, where: str) -> int:
    try:
        return parse_bytes(value)
    except (QuantityError, TypeError) as e:
        raise ScenarioError(f"{where}: {e}") from e


def _seconds(value: Any, where: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{where} must be a number of seconds")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise ScenarioError(f"{where} must be {'positive' if positive else '0 or more'}")
    return seconds
