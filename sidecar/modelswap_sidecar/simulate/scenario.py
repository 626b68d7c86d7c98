"""A scenario file: GPU shape, model catalogue, trace (generated or CSV), policies, target.

See docs/SIMULATE.md for the format and bench/scenarios/ref-h100.yaml for an example.
Bandwidths are in GB/s (10^9 bytes per second) as hardware is specified; byte quantities
take the CRD's suffixes (`3G` is 3 x 10^9 bytes, `2Gi` is 2 x 2^30).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from modelswap_api.errors import QuantityError
from modelswap_api.quantities import parse_bytes
from modelswap_api.yaml_input import YamlInputError, load_file
from modelswap_sidecar.policy.errors import PolicyInputError
from modelswap_sidecar.policy.inputs import PolicySettings
from modelswap_sidecar.simulate.catalogue import CatalogueModel, models_of
from modelswap_sidecar.simulate.errors import ScenarioError
from modelswap_sidecar.simulate.gpu import GpuShape
from modelswap_sidecar.simulate.traces import GeneratorSpec

GB = 1e9
KINDS = ("modelswap", "dedicated", "keepalive", "lru", "sleepwake")


@dataclass(frozen=True, kw_only=True)
class PolicySpec:
    name: str
    kind: str
    #: modelswap: policy sections (wire form) over the built-in cluster defaults
    overrides: Mapping[str, Any]
    #: modelswap: node settings (watermarks)
    settings: Mapping[str, float]
    idle_after_seconds: float | None = None  # keepalive
    bytes_per_second: float | None = None  # sleepwake
    wake_fixed_seconds: float = 0.0  # sleepwake


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    gpu: GpuShape
    models: tuple[CatalogueModel, ...]
    generator: GeneratorSpec | None
    trace_csv: Path | None
    policies: tuple[PolicySpec, ...]
    target_p99_seconds: float
    max_gpus: int
    grid: Mapping[str, tuple[float, ...]]

    def with_changes(
        self,
        *,
        zipf_alpha: float | None = None,
        mean_rate_per_second: float | None = None,
        host_to_device_gbps: float | None = None,
        duration_seconds: float | None = None,
        seed: int | None = None,
    ) -> Scenario:
        """The same scenario with generator or link figures changed (the grid, the CLI)."""
        generator = self.generator
        if generator is not None:
            changes: dict[str, Any] = {}
            if zipf_alpha is not None:
                changes["zipf_alpha"] = zipf_alpha
            if mean_rate_per_second is not None:
                changes["mean_rate_per_second"] = mean_rate_per_second
            if duration_seconds is not None:
                changes["duration_seconds"] = duration_seconds
            if seed is not None:
                changes["seed"] = seed
            generator = replace(generator, **changes)
        elif any(v is not None for v in (zipf_alpha, mean_rate_per_second, seed)):
            raise ScenarioError("the trace is a CSV file: only a generator takes these changes")
        gpu = self.gpu
        if host_to_device_gbps is not None:
            gpu = replace(gpu, host_to_device_bytes_per_second=host_to_device_gbps * GB)
        return replace(self, generator=generator, gpu=gpu)


def policy_settings(spec: PolicySpec, gpu: GpuShape) -> PolicySettings:
    """The agent's node settings for a modelswap policy: watermarks from the scenario,
    restore-cost estimates from the GPU shape."""
    try:
        return PolicySettings(
            high_watermark_fraction=spec.settings.get("highWatermarkFraction", 0.95),
            low_watermark_fraction=spec.settings.get("lowWatermarkFraction", 0.85),
            swap_in_fixed_seconds=max(gpu.swap_in_fixed_seconds, 1e-3),
            reload_bytes_per_second=gpu.cold_load_bytes_per_second,
            reload_fixed_seconds=max(gpu.cold_start_seconds, 1e-3),
        )
    except PolicyInputError as e:
        raise ScenarioError(f"policies[{spec.name}].settings: {e}") from e


def load(path: Path) -> Scenario:
    try:
        documents = load_file(path)
    except (YamlInputError, OSError) as e:
        raise ScenarioError(f"{path}: {e}") from e
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise ScenarioError(f"{path}: expected one YAML mapping")
    try:
        return parse(documents[0], path.parent)
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from e


def parse(doc: Mapping[str, Any], base: Path) -> Scenario:
    _known(doc, {"name", "gpu", "models", "trace", "policies", "target", "maxGpus", "grid"}, "")
    models = models_of(doc.get("models"))
    generator, csv_path = _trace(_mapping(doc, "trace"), base)
    target = _mapping(doc, "target", required=False)
    _known(target, {"p99AddedSeconds"}, "target.")
    max_gpus = doc.get("maxGpus", len(models))
    if not isinstance(max_gpus, int) or isinstance(max_gpus, bool) or max_gpus < 1:
        raise ScenarioError("maxGpus must be a whole number of at least 1")
    grid = _mapping(doc, "grid", required=False)
    _known(grid, {"zipfAlpha", "hostToDeviceGBps", "meanRatePerSecond"}, "grid.")
    return Scenario(
        name=str(doc.get("name", "scenario")),
        gpu=_gpu(_mapping(doc, "gpu")),
        models=models,
        generator=generator,
        trace_csv=csv_path,
        policies=_policies(doc.get("policies")),
        target_p99_seconds=_number(target, "p99AddedSeconds", "target.", default=1.0),
        max_gpus=max_gpus,
        grid={key: tuple(_numbers(grid[key], f"grid.{key}")) for key in grid},
    )


def _gpu(doc: Mapping[str, Any]) -> GpuShape:
    byte_fields = {
        "hbmBytes": "hbm_bytes",
        "reserveBytes": "reserve_bytes",
        "perProcessOverheadBytes": "per_process_overhead_bytes",
        "hostStoreBytes": "host_store_bytes",
    }
    rate_fields = {
        "hostToDeviceGBps": "host_to_device_bytes_per_second",
        "deviceToHostGBps": "device_to_host_bytes_per_second",
        "coldLoadGBps": "cold_load_bytes_per_second",
    }
    time_fields = {
        "coldStartSeconds": "cold_start_seconds",
        "swapInFixedSeconds": "swap_in_fixed_seconds",
        "swapOutFixedSeconds": "swap_out_fixed_seconds",
    }
    _known(doc, {*byte_fields, *rate_fields, *time_fields, "concurrentRequests"}, "gpu.")
    values: dict[str, Any] = {}
    for key, name in byte_fields.items():
        if key not in doc and key in ("reserveBytes", "perProcessOverheadBytes"):
            values[name] = 0
            continue
        raw = doc.get(key)
        if raw is None:
            raise ScenarioError(f"gpu.{key} is required")
        try:
            values[name] = 0 if raw == 0 else parse_bytes(raw)
        except (QuantityError, TypeError) as e:
            raise ScenarioError(f"gpu.{key}: {e}") from e
    for key, name in rate_fields.items():
        values[name] = _number(doc, key, "gpu.") * GB
    for key, name in time_fields.items():
        if key in doc:
            values[name] = _number(doc, key, "gpu.")
    if "concurrentRequests" in doc:
        values["concurrent_requests"] = doc["concurrentRequests"]
    return GpuShape(**values)


def _trace(doc: Mapping[str, Any], base: Path) -> tuple[GeneratorSpec | None, Path | None]:
    _known(doc, {"generator", "csv"}, "trace.")
    if ("generator" in doc) == ("csv" in doc):
        raise ScenarioError("trace needs exactly one of generator and csv")
    if "csv" in doc:
        return None, base / str(doc["csv"])
    g = _mapping(doc, "generator")
    fields = {
        "durationSeconds": "duration_seconds",
        "meanRatePerSecond": "mean_rate_per_second",
        "zipfAlpha": "zipf_alpha",
        "interArrivalCv": "inter_arrival_cv",
        "diurnalPeakToTrough": "diurnal_peak_to_trough",
        "outputTokensMean": "output_tokens_mean",
        "outputTokensSigma": "output_tokens_sigma",
        "inputTokensMean": "input_tokens_mean",
        "inputTokensSigma": "input_tokens_sigma",
    }
    _known(g, {*fields, "seed"}, "trace.generator.")
    required = ("durationSeconds", "meanRatePerSecond", "zipfAlpha")
    values: dict[str, Any] = {
        name: _number(g, key, "trace.generator.")
        for key, name in fields.items()
        if key in g or key in required
    }
    seed = g.get("seed", 1)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ScenarioError("trace.generator.seed must be a whole number")
    return GeneratorSpec(**values, seed=seed), None


def _policies(items: Any) -> tuple[PolicySpec, ...]:
    if items is None:
        items = [{"name": kind, "kind": kind} for kind in KINDS]
    if not isinstance(items, list) or not items:
        raise ScenarioError("policies must be a non-empty list")
    out = []
    for p, item in enumerate(items):
        at = f"policies[{p}]."
        if not isinstance(item, dict):
            raise ScenarioError(f"policies[{p}] must be a mapping")
        _known(item, {"name", "kind", "swapPolicy", "kvCache", "gateway", "settings",
                      "idleAfterSeconds", "bytesPerSecond", "wakeFixedSeconds"}, at)  # fmt: skip
        kind = item.get("kind")
        if kind not in KINDS:
            raise ScenarioError(f"{at}kind must be one of {', '.join(KINDS)}")
        settings = item.get("settings") or {}
        if not isinstance(settings, dict):
            raise ScenarioError(f"{at}settings must be a mapping")
        _known(settings, {"highWatermarkFraction", "lowWatermarkFraction"}, f"{at}settings.")
        out.append(
            PolicySpec(
                name=str(item.get("name", kind)),
                kind=kind,
                overrides={s: item[s] for s in ("swapPolicy", "kvCache", "gateway") if s in item},
                settings={k: _number(settings, k, f"{at}settings.") for k in settings},
                idle_after_seconds=(
                    _number(item, "idleAfterSeconds", at, default=300.0)
                    if kind == "keepalive"
                    else None
                ),
                bytes_per_second=(
                    _number(item, "bytesPerSecond", at, default=15e9)
                    if kind == "sleepwake"
                    else None
                ),
                wake_fixed_seconds=_number(item, "wakeFixedSeconds", at, default=0.0),
            )
        )
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise ScenarioError("policies: names must be unique")
    return tuple(out)


def _mapping(doc: Mapping[str, Any], key: str, *, required: bool = True) -> Mapping[str, Any]:
    value = doc.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise ScenarioError(f"{key} must be a mapping")
    return value


def _known(doc: Mapping[str, Any], known: set[str], prefix: str) -> None:
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ScenarioError(f"{prefix}{unknown[0]}: unknown field")


def _number(
    doc: Mapping[str, Any], key: str, prefix: str, *, default: float | None = None
) -> float:
    value = doc.get(key, default)
    if isinstance(value, str):  # YAML 1.1 reads 15e9 (no dot) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScenarioError(f"{prefix}{key} must be a number")
    return float(value)


def _numbers(value: Any, where: str) -> list[float]:
    if not isinstance(value, list) or not value:
        raise ScenarioError(f"{where} must be a non-empty list of numbers")
    return [_number({"": v}, "", where) for v in value]
