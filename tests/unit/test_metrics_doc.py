"""docs/METRICS.md lists exactly the metrics the code defines."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    ROOT / "sidecar" / "modelswap_sidecar" / "metrics.py",
    ROOT / "sidecar" / "modelswap_sidecar" / "gateway" / "metrics.py",
    ROOT / "operator" / "modelswap_operator" / "metrics.py",
]
#: Counters (a prometheus_client Counter, or a collector's CounterMetricFamily) are
#: exported with the `_total` suffix.
COUNTER_RE = re.compile(r'Counter(?:MetricFamily)?\(\s*"(modelswap_[a-z_]+)"')
NAME_RE = re.compile(r'"(modelswap_[a-z_]+)"')


def defined_metrics() -> set[str]:
    names: set[str] = set()
    for source in SOURCES:
        text = source.read_text()
        counters = set(COUNTER_RE.findall(text))
        for name in NAME_RE.findall(text):
            names.add(f"{name}_total" if name in counters else name)
    return names


def documented_metrics() -> set[str]:
    return set(
        re.findall(
            r"^\| `(modelswap_[a-z_]+)` \|", (ROOT / "docs" / "METRICS.md").read_text(), re.M
        )
    )


def test_every_metric_in_the_code_is_documented_and_vice_versa() -> None:
    defined = defined_metrics()
    assert len(defined) >= 20
    assert defined == documented_metrics()
