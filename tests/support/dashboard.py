"""The metrics the chart's Grafana dashboard queries, and whether a scrape has them."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "charts" / "modelswap" / "dashboards" / "modelswap.json"
)
#: What a family's samples may add to its name in the text format.
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created")


def dashboard_metrics() -> set[str]:
    """Every `modelswap_*` name in the dashboard's panel and variable queries."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    names: set[str] = set()
    for expr in exprs:
        names |= set(re.findall(r"\bmodelswap_[a-z0-9_]+", expr))
    return names


def scraped_names(text: str) -> set[str]:
    """Every name a Prometheus text scrape can answer a query for: each declared family
    (`# TYPE`, present even before a labelled family has samples) with its suffixes."""
    families = re.findall(r"^# TYPE (\S+) \S+$", text, re.MULTILINE)
    return {family.removesuffix("_total") + suffix for family in families for suffix in SUFFIXES}


def named_metrics(text: str) -> set[str]:
    """The `modelswap_*` metric names a document names in backticks (not the Python
    packages, `modelswap_client`), as regular expressions (`*` in a name stands for any
    part of it: `modelswap_hbm_*_bytes`)."""
    names = re.findall(r"`(modelswap_[a-z0-9_*]+)`", text)
    return {name.replace("*", "[a-z0-9_]*") for name in names
            if "*" in name or importlib.util.find_spec(name) is None}  # fmt: skip
