"""Model generations: the `metadata.generation` at which a ModelDeployment's `spec.model`
last changed (pure).

Each entry the operator pushes carries its model generation; with the uid it names the
model *instance* an agent holds (docs/AGENT.md, "Model instances"), so a changed model is
a new instance, rolled out beside the old one. Only the fields that change the model's
bytes count (`spec.model.source.uri`/`sha256`, `weightsBytes`, `kvCacheBytes`,
`runtime`, as `agent.core.model_changes` lists them): `spec.model.name` and the
credentials Secret are taken in place, as are policy edits.

The operator keeps the model generation in `status.modelGeneration` beside
`status.modelDigest`, a digest of those fields, so a restarted operator (or a new leader)
sends the same model generation until `spec.model` changes again, including an edit made
while no operator ran. An object whose status an operator wrote before model generations
existed (an `observedGeneration`, no `modelDigest`) is taken as model generation 1: the
model its node holds is kept, not reloaded by the upgrade.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from modelswap_api.models import ModelSpec

#: Model generation 1: what agents held before model generations existed is keyed by it.
BASE_MODEL_GENERATION = 1


def digest(model: ModelSpec) -> str:
    """`sha256:<hex>` of the fields of `spec.model` that change what is loaded."""
    kv = model.kv_cache_bytes.bytes if model.kv_cache_bytes is not None else 0
    fields = {
        "uri": model.source.uri,
        "sha256": model.source.sha256,
        "weightsBytes": model.weights_bytes.bytes,
        "kvCacheBytes": kv,
        "runtime": model.runtime or "triton",
    }
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def model_generation(
    *,
    generation: int,
    model_digest: str,
    status: Mapping[str, Any] | None,
    remembered: tuple[str, int] | None,
) -> int:
    """The model generation of a ModelDeployment at `generation` whose `spec.model` has
    `model_digest`. `remembered` is (digest, model generation) this operator decided last
    (its status may not be written yet); `status` is the object's status."""
    if remembered is not None and remembered[0] == model_digest:
        return remembered[1]
    written = status or {}
    written_generation = written.get("modelGeneration")
    if written.get("modelDigest") == model_digest and isinstance(written_generation, int):
        return min(max(written_generation, 1), generation)
    if remembered is None and "modelDigest" not in written and written.get("observedGeneration"):
        return BASE_MODEL_GENERATION  # written before model generations: the held model
    return generation
