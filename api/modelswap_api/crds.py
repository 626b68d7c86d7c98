"""The CRDs this project defines, loaded from the YAML files in `crds/`.

`crds/` at the repository root is the source of truth; the package reaches it through the
`modelswap_api/crds` link (copied into wheels as package data).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from modelswap_api.errors import CrdError

GROUP = "modelswap.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
MODEL_DEPLOYMENT = "ModelDeployment"
SWAP_NODE = "SwapNode"

CRD_DIR = Path(__file__).resolve().parent / "crds"


@functools.cache
def load_crds() -> Mapping[str, Mapping[str, Any]]:
    """Our CRDs keyed by kind."""
    crds: dict[str, Mapping[str, Any]] = {}
    paths = sorted(CRD_DIR.glob("*.yaml"))
    if not paths:
        raise CrdError(f"no CRD files found in {CRD_DIR}")
    for path in paths:
        with path.open() as f:
            crd = yaml.safe_load(f)
        if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
            raise CrdError(f"{path} is not a CustomResourceDefinition")
        crds[crd["spec"]["names"]["kind"]] = crd
    return crds


def crd_for(kind: str) -> Mapping[str, Any]:
    """The CRD of one of our kinds; CrdError naming the known kinds otherwise."""
    crds = load_crds()
    if kind not in crds:
        raise CrdError(f"kind {kind!r} is not a modelswap kind (known: {', '.join(sorted(crds))})")
    return crds[kind]


def version_of(crd: Mapping[str, Any], version: str) -> Mapping[str, Any]:
    """One version entry of a CRD."""
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return dict(entry)
    raise CrdError(f"{crd['metadata']['name']} has no version {version!r}")
