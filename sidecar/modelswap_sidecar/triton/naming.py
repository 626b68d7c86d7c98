"""Triton model names derived from ModelDeployment UIDs.

The name users call (`spec.model.name`) is not unique on a node: two namespaces may both
deploy `llama`. Triton's model namespace is flat, so the driver names every model after its
ModelDeployment's UID: `m-` followed by the UID's 32 hex digits (dashes dropped, lower
case). The name is a valid directory name, a valid Triton model name, and gives nothing
away about the tenant.
"""

from __future__ import annotations

import re
import uuid

PREFIX = "m-"
_NAME = re.compile(r"^m-[0-9a-f]{32}$")


def triton_model_name(uid: str) -> str:
    """`m-<uid without dashes>`; raises ValueError for a UID that is not a UUID."""
    try:
        parsed = uuid.UUID(uid)
    except ValueError as e:
        raise ValueError(f"not a UID: {uid!r}") from e
    return PREFIX + parsed.hex


def is_triton_model_name(name: str) -> bool:
    return _NAME.match(name) is not None


def uid_of(name: str) -> str:
    """The canonical (dashed) UID a Triton model name was derived from."""
    if not is_triton_model_name(name):
        raise ValueError(f"not a modelswap Triton model name: {name!r}")
    return str(uuid.UUID(hex=name.removeprefix(PREFIX)))
