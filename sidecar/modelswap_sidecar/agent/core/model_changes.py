"""A new entry for a model the agent already holds that changes what the model *is*.

`spec.model.source` (uri, sha256), `weightsBytes`, `kvCacheBytes` or `runtime` changing
for a model that is loaded, or whose bytes the host store keeps, cannot be taken in place:
the runtime serves the old weights, and a later load would restore the old bytes from the
host store, not the new source. A changed model is a new *instance*: the operator sends it
with a new model generation (`DesiredEntry.model_generation`, `instances`) and the agent
rolls it out beside the old one. An entry that changes these fields under the same model
generation (a sender that does not track model generations) is answered `conflict`
(`ModelChanged`, naming the fields) and nothing of it is applied; the model keeps serving
as it was. `spec.model.name` (the name users call) and the credentials
Secret change nothing in memory and are taken in place. A model that holds nothing yet
(pending, deferred, or failed before any byte was kept) takes the new spec as usual — a
corrected source is how a failed load is fixed. Pure.
"""

from __future__ import annotations

from modelswap_api.control import EntryResult
from modelswap_api.models import ModelSpec


def changed_fields(old: ModelSpec, new: ModelSpec) -> tuple[str, ...]:
    """The `spec.model` fields that differ in a way that changes the model's bytes."""
    changed = []
    if old.source.uri != new.source.uri:
        changed.append("spec.model.source.uri")
    if old.source.sha256 != new.source.sha256:
        changed.append("spec.model.source.sha256")
    if old.weights_bytes.bytes != new.weights_bytes.bytes:
        changed.append("spec.model.weightsBytes")
    old_kv = old.kv_cache_bytes.bytes if old.kv_cache_bytes is not None else 0
    new_kv = new.kv_cache_bytes.bytes if new.kv_cache_bytes is not None else 0
    if old_kv != new_kv:
        changed.append("spec.model.kvCacheBytes")
    if (old.runtime or "triton") != (new.runtime or "triton"):
        changed.append("spec.model.runtime")
    return tuple(changed)


def refusal(uid: str, fields: tuple[str, ...], held_as: str) -> EntryResult:
    """The answer to an entry that changes `fields` of a model held as `held_as`."""
    return EntryResult(
        uid=uid,
        outcome="conflict",
        reason="ModelChanged",
        message=(
            f"{', '.join(fields)} changed for a model this node holds ({held_as}) under the "
            "same model generation; nothing of this entry was applied (the model serves as "
            "before). A changed model is rolled out when its entry carries a new "
            'modelGeneration, as the operator sends it (docs/AGENT.md, "Model instances")'
        ),
    )
